"""The outbox-row lifecycle, written once for every store.

The rules live here (which row a settlement may move, who counts attempts, when a
requeued row is superseded by a newer pending row of its key); a store supplies
only an :class:`OutboxTable` — one transaction's primitive reads and writes of its
outbox table — and says how to run a transaction (:meth:`OutboxStore.write`,
:meth:`OutboxStore.read`).  The store alone counts attempts: a send that did not
arrive (requeue) or failed counts one; completion, an unknown outcome, and
reconciliation's verdicts count none.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from troth.outbox import codes
from troth.outbox.rows import OutboxRow, RowState, Settlement
from troth.protocol.address import parse_poll
from troth.store.sql.codec import RowCodec

#: How long ago (seconds) a message for a stream may have failed for want of a
#: connection and still be offered again when that stream is published.
REVIVE_WINDOW = 3600.0

T = TypeVar("T")


class Cursor(Protocol):
    """What :class:`SqlOutboxTable` needs of a DB-API cursor (sqlite3, psycopg)."""

    def execute(self, sql: Any, params: Any = ..., /) -> Any: ...


def in_claim_order(rows: list[OutboxRow]) -> list[OutboxRow]:
    """Claimed rows, oldest due first (a claim's RETURNING has no order)."""
    rows.sort(key=lambda r: (r.available_at, r.id))
    return rows


class OutboxTable(ABC):
    """One transaction's access to the outbox table: what a dialect implements."""

    @abstractmethod
    def claim(self, worker_id: str, now: int, limit: int, token: str) -> list[OutboxRow]:
        """Due pending rows to ``dispatching`` (skip-locked where rows lock)."""

    @abstractmethod
    def find(self, row_id: int, state: RowState, token: str | None) -> tuple[str, int] | None:
        """``(key, attempts)`` of the row if it is in ``state`` (and, with a token, held
        under it), locking it where rows lock; else None."""

    @abstractmethod
    def has_pending(self, key: str) -> bool: ...

    @abstractmethod
    def finish(
        self, row_id: int, state: RowState, attempts: int, code: str | None, now: int
    ) -> None:
        """Set state, attempts and code; drop the claim token."""

    @abstractmethod
    def requeue(
        self, row_id: int, attempts: int, code: str | None, now: int, available_at: int
    ) -> None:
        """Back to ``pending`` at ``available_at``; drop the claim token."""

    def finish_many(self, items: Sequence[Settlement]) -> set[int]:
        """Settlements that end distinct held rows (no requeue); the ids settled.

        Dialects with a one-statement form override it (PostgreSQL)."""
        done: set[int] = set()
        for s in items:
            found = self.find(s.row_id, RowState.DISPATCHING, s.token)
            if found is not None:
                attempts = found[1] + (s.state == RowState.FAILED)
                self.finish(s.row_id, s.state, attempts, s.code, s.now)
                done.add(s.row_id)
        return done

    @abstractmethod
    def unknown_rows(self, limit: int) -> list[OutboxRow]: ...

    @abstractmethod
    def release_expired(
        self, cutoff: int, now: int, code: str, since: int | None = None
    ) -> int: ...

    @abstractmethod
    def purge_completed(self, before: int) -> int: ...

    @abstractmethod
    def next_due(self) -> int | None: ...

    @abstractmethod
    def expedite(self, key: str) -> int:
        """The pending row of ``key``, if held back, due as written (its ``created_at``)."""

    @abstractmethod
    def newer_execute(self, task_id: str, row_id: int) -> bool:
        """Whether an execute newer than row ``row_id`` was written for ``task_id``."""

    def stranded(self, now: int, since: int) -> list[tuple[int, str, str, str, int]]:
        """``(id, key, state, address, created_at)`` of the rows no connection could
        take: pending and backed off past ``now`` for want of one
        (``troth.poll.no_connection``), or failed at or after ``since`` when their
        attempts ran out (only a missing connection fails a ``poll://`` send so),
        but not an execute whose task has a newer one, sent or not (the newer
        message is the one that counts).

        A node of a cluster offers these again through the cluster's own query
        (``server/delivery/cluster.py``); a dialect without one need not answer."""
        raise NotImplementedError("a cluster's node revives through connections_revive")


def settle_row(table: OutboxTable, s: Settlement) -> bool:
    """One settlement by the rules of ``outbox.rows``; False if the row does not match."""
    expected = RowState.DISPATCHING if s.token is not None else RowState.OUTCOME_UNKNOWN
    found = table.find(s.row_id, expected, s.token)
    if found is None:
        return False
    key, attempts = found
    counted = s.token is not None and s.state in (RowState.PENDING, RowState.FAILED)
    if counted:
        attempts += 1
    if s.state == RowState.PENDING:
        at = s.available_at if s.available_at is not None else s.now
        requeue_or_supersede(table, s.row_id, key, attempts, s.now, at, s.code)
    else:
        table.finish(s.row_id, s.state, attempts, s.code, s.now)
    return True


def requeue_or_supersede(
    table: OutboxTable,
    row_id: int,
    key: str,
    attempts: int,
    now: int,
    available_at: int,
    code: str | None,
) -> None:
    """Back to pending, unless a newer pending row of the key supersedes it (at most
    one pending row per key: the newer message is the one to send)."""
    if table.has_pending(key):
        table.finish(row_id, RowState.COMPLETED, attempts, codes.SUPERSEDED, now)
    else:
        table.requeue(row_id, attempts, code, now, available_at)


class SqlOutboxTable(OutboxTable):
    """The outbox table of a SQL dialect, through its named queries.

    Both dialects' ``queries.sql`` name these queries alike and take their
    parameters in the same order; a dialect adds only its claim (and may override
    :meth:`finish_many`).  Memory's ``pending_by_key`` is the partial unique index
    there: a row is "the pending row of its key" exactly while it is ``pending``.
    """

    def __init__(self, cursor: Cursor, queries: Mapping[str, str], codec: RowCodec) -> None:
        self.cur = cursor
        self.q = queries
        self.codec = codec

    def find(self, row_id: int, state: RowState, token: str | None) -> tuple[str, int] | None:
        if token is None:
            found = self.cur.execute(self.q["in_state"], (row_id, str(state))).fetchone()
        else:
            found = self.cur.execute(self.q["held"], (row_id, token)).fetchone()
        return None if found is None else (found[0], found[1])

    def has_pending(self, key: str) -> bool:
        return self.cur.execute(self.q["has_pending"], (key,)).fetchone() is not None

    def finish(
        self, row_id: int, state: RowState, attempts: int, code: str | None, now: int
    ) -> None:
        at = self.codec.int_in(now)
        self.cur.execute(self.q["finish"], (str(state), attempts, code, at, row_id))

    def requeue(
        self, row_id: int, attempts: int, code: str | None, now: int, available_at: int
    ) -> None:
        i = self.codec.int_in
        self.cur.execute(self.q["requeue"], (attempts, code, i(now), i(available_at), row_id))

    def unknown_rows(self, limit: int) -> list[OutboxRow]:
        found = self.cur.execute(self.q["unknown_rows"], (limit,)).fetchall()
        return [self.codec.outbox_row(r) for r in found]

    def release_expired(self, cutoff: int, now: int, code: str, since: int | None = None) -> int:
        i = self.codec.int_in
        args: tuple[object, ...]
        if since is None:
            sql, args = self.q["release_expired"], (code, i(now), i(cutoff))
        else:
            sql, args = self.q["release_expired_since"], (code, i(now), i(since), i(cutoff))
        count: int = self.cur.execute(sql, args).rowcount
        return count

    def purge_completed(self, before: int) -> int:
        before_ = self.codec.int_in(before)
        count: int = self.cur.execute(self.q["purge_completed"], (before_, before_)).rowcount
        return count

    def next_due(self) -> int | None:
        found: int | None = self.codec.int_out(self.cur.execute(self.q["next_due"]).fetchone()[0])
        return found

    def expedite(self, key: str) -> int:
        count: int = self.cur.execute(self.q["expedite"], (key,)).rowcount
        return count

    def newer_execute(self, task_id: str, row_id: int) -> bool:
        return self.cur.execute(self.q["newer_execute"], (task_id, row_id)).fetchone() is not None


class OutboxStore(ABC):
    """``outbox.rows.OutboxLifecycle`` over a dialect's :class:`OutboxTable`."""

    independent: bool = False

    @abstractmethod
    def write(self, fn: Callable[[OutboxTable], T]) -> T:
        """Run ``fn`` in one write transaction (re-run on conflicts where that applies)."""

    def read(self, fn: Callable[[OutboxTable], T]) -> T:
        """Run a read-only ``fn`` (a dialect may read without a write transaction)."""
        return self.write(fn)

    def write_one(self, fn: Callable[[OutboxTable], T]) -> T:
        """Run ``fn``, which sends exactly one statement, as one write transaction (a
        dialect may send the statement alone: PostgreSQL's one round trip)."""
        return self.write(fn)

    def claim_due(self, worker_id: str, now: int, limit: int, token: str) -> list[OutboxRow]:
        return in_claim_order(self.write_one(lambda t: t.claim(worker_id, now, limit, token)))

    def settle(self, items: Sequence[Settlement]) -> list[bool]:
        """Several settlements in one transaction, in the order given.

        Settlements that end distinct held rows go together (``finish_many``: the
        dispatcher's common case); a requeue (which may meet a newer pending row of
        its key), a reconciliation or a row named twice goes one by one.
        """
        ids = [s.row_id for s in items]
        if len(set(ids)) == len(ids) and all(
            s.token is not None and s.state != RowState.PENDING for s in items
        ):
            done = self.write_one(lambda t: t.finish_many(items))
            return [s.row_id in done for s in items]
        return self.write(lambda t: [settle_row(t, s) for s in items])

    def unknown_rows(self, limit: int) -> list[OutboxRow]:
        return self.read(lambda t: t.unknown_rows(limit))

    def release_expired_claims(
        self, cutoff: int, now: int, code: str, since: int | None = None
    ) -> int:
        return self.write(lambda t: t.release_expired(cutoff, now, code, since))

    def purge_completed(self, before: int) -> int:
        return self.write(lambda t: t.purge_completed(before))

    def next_due(self) -> int | None:
        return self.read(lambda t: t.next_due())

    def expedite(self, keys: Sequence[str]) -> int:
        if not keys:
            return 0
        return self.write(lambda t: sum(t.expedite(key) for key in keys))

    def revive(self, group: str, id: str, now: int, since: int) -> tuple[int, int]:
        """A worker connected to ``group/id`` on a node of its own (SQLite, memory):
        what could not be delivered to exactly that stream is offered again, as a
        cluster does when a node publishes a stream (``server/delivery/cluster.py``, "No
        message is stranded").  Those backed off come due at once; of those that
        failed since ``since``, the newest of each key is pending again with its
        attempts starting over, unless a pending row of the key holds its place.
        Returns ``(backed off, failed)`` offered again."""
        group = group.lower()

        def run(t: OutboxTable) -> tuple[int, int]:
            held = 0
            newest: dict[str, tuple[int, int]] = {}
            for row_id, key, state, address, created in t.stranded(now, since):
                poll = parse_poll(address)
                if poll is None or poll.group != group or poll.id != id:
                    continue
                if state == RowState.PENDING:
                    held += t.expedite(key)
                elif row_id > newest.get(key, (-1, 0))[0]:
                    newest[key] = (row_id, created)
            failed = 0
            for key, (row_id, created) in newest.items():
                if not t.has_pending(key):
                    t.requeue(row_id, 0, None, now, created)
                    failed += 1
            return held, failed

        return self.write(run)

    def retry(self, rows: Sequence[tuple[int, str, str | None]], now: int) -> list[int]:
        return self.write(lambda t: retry_failed(t, rows, now))


def retry_failed(
    t: OutboxTable, rows: Sequence[tuple[int, str, str | None]], now: int
) -> list[int]:
    """Failed rows ``(id, key, task id)`` pending again, due now, their attempts
    starting over (``troth outbox retry``): those still failed, unless a pending row
    of their key holds its place or a newer execute of their task was written (the
    newer message is the one that counts).  The ids made pending."""
    done: list[int] = []
    for row_id, key, task_id in rows:
        if t.find(row_id, RowState.FAILED, None) is None or t.has_pending(key):
            continue
        if task_id is not None and t.newer_execute(task_id, row_id):
            continue
        t.requeue(row_id, 0, None, now, now)
        done.append(row_id)
    return done


def settle_one(
    life: OutboxStore,
    row_id: int,
    token: str | None,
    state: str,
    now: int,
    code: str | None = None,
    available_at: int | None = None,
) -> bool:
    """One settlement through :meth:`OutboxStore.settle` (tests, tools)."""
    return life.settle([Settlement(row_id, token, RowState(state), now, code, available_at)])[0]
