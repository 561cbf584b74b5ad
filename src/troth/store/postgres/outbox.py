"""The PostgreSQL outbox lifecycle: its own connection, routed claims, NOTIFY.

The rules are ``store/outbox.py``'s; this module supplies the table, a session of
its own with ``synchronous_commit = off``, the claim routing of several nodes, and
the wake-ups between nodes (``docs/architecture.md``, "Several nodes").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from troth.outbox.rows import OutboxRow, RowState, Settlement
from troth.store.base import BatchClaim
from troth.store.outbox import OutboxStore, OutboxTable, SqlOutboxTable
from troth.store.postgres.claims import Reach
from troth.store.postgres.rows import CODEC, Q
from troth.store.postgres.session import Cur, Session

T = TypeVar("T")

#: The channel of ``PostgresOutbox.notify``; its payload is
#: ``"{node} {messages} {deadline|-}"`` (``server/delivery/cluster.py``).
CHANNEL: Final = "troth"


@dataclass(frozen=True)
class Routing:
    """How a node of several claims poll:// rows (set by ``server/delivery/cluster.py``).

    ``reach`` answers, from any thread, the groups and ``group/id`` pairs this node
    holds SSE connections for right now; ``timeout_ms`` is how old another node's
    heartbeat may be before its connections stop counting.
    """

    node: str
    timeout_ms: int
    reach: Reach


def claim_statement(routing: Routing | None, claim: BatchClaim) -> tuple[str, dict[str, Any]]:
    """The claim's statement: ``claim``, or ``claim_routed`` on a node of several."""
    params: dict[str, Any] = {
        "now": claim.now,
        "limit": claim.limit,
        "token": claim.token,
        "worker": claim.worker_id,
    }
    if routing is None:
        return Q["claim"], params
    groups, pairs = routing.reach()
    params.update(
        node=routing.node, timeout=routing.timeout_ms, groups=list(groups), pairs=list(pairs)
    )
    return Q["claim_routed"], params


def claimed_rows(rows: Sequence[Any]) -> list[OutboxRow]:
    """The claim's returned rows, decoded (``claim_due`` puts them in order)."""
    return [CODEC.outbox_row(r) for r in rows]


class OutboxSession(Session):
    """The outbox lifecycle's own connection, with ``synchronous_commit = off``.

    Claims and settlements are the dispatcher's bookkeeping, not anything a client
    was told: losing the last few to a database crash is safe.  A lost claim leaves
    the row pending (it is sent again: delivery is at least once, and every message
    tolerates a duplicate); a lost settlement leaves it claimed, and the reaper
    makes it outcome_unknown for reconciliation.  So they need not wait for a WAL
    flush, and they do not queue behind the writer's request batches.

    Each statement is planned for the table as it is when it runs
    (``plan_cache_mode = force_custom_plan``), never from a generic plan cached while
    the outbox was small: such a plan (a sequential scan, fine for a few pages) would
    stay in use as the table grows, until autovacuum next analyses it, and settling a
    few claims would then read the whole table.  Planning these few short statements
    costs tens of microseconds each.
    """

    application_name = "troth-outbox"
    settings = ("synchronous_commit = off", "plan_cache_mode = force_custom_plan")


class PostgresOutbox(OutboxStore):
    """The outbox-row lifecycle (``outbox.rows.OutboxLifecycle``) over the outbox table.

    Row for row what the memory store's ``MemoryOutbox`` does, each call one transaction
    (re-run on conflicts) on a connection of its own (:class:`OutboxSession`, opened
    on first use), so it may run on another thread than the writer's, at the same
    time (:attr:`independent`).  Claims take ``FOR UPDATE SKIP LOCKED``, so
    dispatchers on several nodes split the due rows; settlements lock the row they
    check.  With :attr:`routing` set, a node claims only what it can deliver (see
    ``Q["claim_routed"]``).

    ``options`` says what the session connects with, asked when it opens: the
    store's ``PostgresStore.session_options``.
    """

    #: Safe to call from any thread, concurrently with the store's batches.
    independent = True

    def __init__(self, options: Callable[[], dict[str, Any]]) -> None:
        self.options = options
        self.routing: Routing | None = None
        self._session: OutboxSession | None = None
        self._opening = threading.Lock()

    @property
    def session(self) -> OutboxSession:
        with self._opening:
            if self._session is None:
                self._session = OutboxSession(**self.options())
            return self._session

    def run(self, fn: Callable[[Cur], T]) -> T:
        return self.session.run(fn)

    def write(self, fn: Callable[[OutboxTable], T]) -> T:
        routing = self.routing
        return self.run(lambda cur: fn(PostgresOutboxTable(cur, routing)))

    def write_one(self, fn: Callable[[OutboxTable], T]) -> T:
        """One statement, one round trip (``Session.run_single``): the dispatcher's
        claims and settlements."""
        routing = self.routing
        return self.session.run_single(lambda cur: fn(PostgresOutboxTable(cur, routing)))

    def notify(self, payload: str) -> None:
        """``NOTIFY troth`` on the outbox connection, at once (its own transaction)."""
        self.session.run_single(lambda cur: cur.execute(Q["notify"], (payload,)))

    def close(self) -> None:
        with self._opening:
            if self._session is not None:
                self._session.close()
                self._session = None


class PostgresOutboxTable(SqlOutboxTable):
    """The outbox table on one transaction of the outbox session."""

    def __init__(self, cur: Cur, routing: Routing | None) -> None:
        super().__init__(cur, Q, CODEC)
        self.routing = routing

    def claim(self, worker_id: str, now: int, limit: int, token: str) -> list[OutboxRow]:
        claim = BatchClaim(worker_id, now, limit, token)
        return claimed_rows(self.cur.execute(*claim_statement(self.routing, claim)).fetchall())

    def finish_many(self, items: Sequence[Settlement]) -> set[int]:
        values = [
            (s.row_id, s.token, str(s.state), int(s.state == RowState.FAILED), s.code, str(s.now))
            for s in items
        ]
        columns = [list(column) for column in zip(*values, strict=True)]
        return {r[0] for r in self.cur.execute(Q["finish_many"], columns).fetchall()}
