"""Read-only views of a store for operators: ``troth explain`` and ``/ops/…``.

Not the machine's reads: those lock rows on PostgreSQL and run on the writer.  An
inspection reads without locking anything, on a connection of its own where the
backend has one (a SQLite WAL reader, a separate PostgreSQL session), so an operator
looking inside never holds up a request.  What it reads is one consistent snapshot
(one read transaction), which is what lets ``explain`` relate a promise, its task
and the task's outbox rows to each other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import msgspec

from troth.flow.limits import Held, stored_held, stored_limit
from troth.outbox.rows import OutboxRow
from troth.protocol.records import PENDING, TAG_ORIGIN, Promise, Schedule, Tags, Task
from troth.store.outbox import Cursor
from troth.store.sql.codec import OUTBOX_COLS, PROMISE_COLS, SCHEDULE_COLS, TASK_COLS, RowCodec

#: Sorts after every character (UTF-8 F4 8F BF BF): ``prefix + ID_END`` bounds the ids
#: that start with ``prefix`` (both stores compare ids bytewise).
ID_END: Final = "\U0010ffff"
#: Ids one ``IN (…)`` read takes (well under SQLite's and psycopg's parameter limits).
IDS_PER_READ: Final = 500
#: Stored tags: a JSON object of strings.
_TAGS: Final = msgspec.json.Decoder(dict[str, str])
#: Rows one tree read returns at most (a workflow larger than this is cut, and says so).
TREE_LIMIT: Final = 5000

Counts = dict[str, dict[str, int]]
#: A queued task's columns (``flow.limits.Held``'s fields, in order).
HELD_COLS: Final = "task_id, grp, address, priority, created_at, fkey, turn"
#: Promises one tag search looks at per call (``Inspection.search``).
SEARCH_WINDOW: Final = 10_000
#: Promises one read of a search's window brings (it stops early on a full page).
SEARCH_CHUNK: Final = 500


@dataclass(frozen=True)
class Search:
    """A page of :meth:`Inspection.search`: the matches, where to go on from (None:
    nothing further), and how many promises were looked at (up to ``next``)."""

    promises: list[Promise]
    next: str | None
    looked: int


@dataclass(frozen=True)
class LimitUse:
    """A worker group's limit with its use, as one snapshot reads it (``/metrics``,
    ``explain``): tasks holding a slot, tasks queued for one."""

    group: str
    concurrency: int | None
    in_use: int
    held: int
    rate: float | None = None
    per_key: int | None = None


class Inspection(ABC):
    """One read transaction's view: point reads, a workflow's promises, outbox rows."""

    @abstractmethod
    def promise(self, id: str) -> Promise | None: ...

    @abstractmethod
    def task(self, id: str) -> Task | None: ...

    def tasks(self, ids: Sequence[str]) -> dict[str, Task]:
        """The tasks of ``ids`` that exist, by id: a tree's tasks in a few reads rather
        than one per promise (on PostgreSQL each read is a round trip)."""
        found = {}
        for id in ids:
            t = self.task(id)
            if t is not None:
                found[id] = t
        return found

    @abstractmethod
    def schedule(self, id: str) -> Schedule | None: ...

    def trace(self, id: str) -> str | None:
        """The trace context promise ``id`` was created in (``Backend.get_trace``)."""
        return None

    @abstractmethod
    def tree(self, origin: str, limit: int = TREE_LIMIT) -> list[Promise]:
        """Promises tagged ``resonate:origin = origin``, in id order (an index read)."""

    @abstractmethod
    def promises(
        self, prefix: str, state: str | None, after: str | None, limit: int
    ) -> list[Promise]:
        """Promises whose id starts with ``prefix``, in id order after ``after``: a
        range of the primary key (and, for pending, of the pending index)."""

    @abstractmethod
    def newest(self, prefix: str, limit: int) -> list[Promise]:
        """The last ``limit`` promises whose id starts with ``prefix``, last first (a
        schedule's latest runs: their ids end in the run's timestamp)."""

    @abstractmethod
    def window(
        self, prefix: str, origin: str | None, after: str | None, size: int
    ) -> list[tuple[str, str, Tags]]:
        """``(id, state, tags)`` of the next ``size`` promises in id order after
        ``after``: those whose id starts with ``prefix``, or (``origin``) those of one
        workflow, through its index.  Only the columns a tag filter needs."""

    def promises_of(self, ids: Sequence[str]) -> list[Promise]:
        """The promises of ``ids`` that exist, in id order."""
        found = [p for p in (self.promise(id) for id in dict.fromkeys(ids)) if p is not None]
        return sorted(found, key=lambda p: p.id)

    def search(
        self,
        prefix: str,
        state: str | None,
        tags: Tags,
        after: str | None,
        limit: int,
        window: int = SEARCH_WINDOW,
    ) -> Search:
        """Promises by id prefix, stored state and tags, in id order after ``after``,
        looking at no more than ``window`` of them: a tag no index covers costs a
        bounded read per call, never a scan of the table (``promise.search`` scans
        until it has a page, holding a reader thread that long).  ``next`` continues
        where it stopped, whether it stopped for a full page or at the end of its
        window."""
        origin = tags.get(TAG_ORIGIN)
        matched: list[str] = []
        last, examined, exhausted = after, 0, False
        # Read in chunks: a common tag fills its page from the first one.
        while len(matched) < limit and examined < window and not exhausted:
            size = min(SEARCH_CHUNK, window - examined)
            rows = self.window(prefix, origin, last, size)
            exhausted = len(rows) < size
            for id, st, t in rows:
                last, examined = id, examined + 1
                if (
                    id.startswith(prefix)
                    and (state is None or st == state)
                    and all(t.get(k) == v for k, v in tags.items())
                ):
                    matched.append(id)
                    if len(matched) == limit:
                        break
        full = len(matched) == limit or not exhausted
        return Search(self.promises_of(matched), last if full else None, examined)

    @abstractmethod
    def deliveries(self, task_id: str, limit: int) -> list[OutboxRow]:
        """The outbox rows written for a task (its executes), newest first."""

    @abstractmethod
    def outbox(self, state: str | None, before: int | None, limit: int) -> list[OutboxRow]:
        """Outbox rows, newest first, of one state or all, with ids below ``before``."""

    @abstractmethod
    def counts(self) -> Counts:
        """Rows by state: ``{"promises": {...}, "tasks": {...}, "outbox": {...},
        "schedules": {"all": n}}`` — a scan of each table: for operators, not for a
        request path."""

    def outbox_counts(self) -> dict[str, int]:
        """Outbox rows by state (``/metrics``): :meth:`counts` of that table alone."""
        return self.counts()["outbox"]

    # -- flow control (troth/flow); a store that keeps no limits has none -------------

    def limits(self) -> list[LimitUse]:
        """Every limit with its use, by group: a count of each group's slots and
        queue (an index range each)."""
        return []

    def held(self, ids: Sequence[str]) -> dict[str, Held]:
        """The tasks of ``ids`` queued for a slot of their group, by id."""
        return {}

    def key_in_use(self, group: str, key: str) -> int:
        """How many tasks of ``key`` hold a slot of ``group``."""
        return 0

    def held_ahead(self, held: Held) -> int:
        """How many tasks of its group are queued before ``held``: higher priority,
        then an earlier turn, then created earlier, then a smaller id
        (``flow.limits.held_order``)."""
        return 0


class SqlInspection(Inspection):
    """:class:`Inspection` in SQL both dialects share; ``mark`` is the placeholder."""

    def __init__(self, cur: Cursor, codec: RowCodec, mark: str) -> None:
        self.cur = cur
        self.codec = codec
        self.mark = mark
        self.q = _queries(mark)

    def _one(self, name: str, *params: Any) -> Sequence[Any] | None:
        row: Sequence[Any] | None = self.cur.execute(self.q[name], params).fetchone()
        return row

    def _all(self, name: str, *params: Any) -> list[Sequence[Any]]:
        rows: list[Sequence[Any]] = self.cur.execute(self.q[name], params).fetchall()
        return rows

    def promise(self, id: str) -> Promise | None:
        r = self._one("promise", id)
        return None if r is None else self.codec.promise(r)

    def task(self, id: str) -> Task | None:
        r = self._one("task", id)
        return None if r is None else self.codec.task(r)

    def trace(self, id: str) -> str | None:
        r = self._one("trace", id)
        return None if r is None else cast(str | None, r[0])

    def tasks(self, ids: Sequence[str]) -> dict[str, Task]:
        found: dict[str, Task] = {}
        unique = list(dict.fromkeys(ids))
        for at in range(0, len(unique), IDS_PER_READ):
            chunk = unique[at : at + IDS_PER_READ]
            marks = ", ".join([self.mark] * len(chunk))
            sql = f"SELECT {TASK_COLS} FROM tasks WHERE id IN ({marks})"
            for r in self.cur.execute(sql, chunk).fetchall():
                t = self.codec.task(r)
                found[t.id] = t
        return found

    def schedule(self, id: str) -> Schedule | None:
        r = self._one("schedule", id)
        return None if r is None else self.codec.schedule(r)

    def tree(self, origin: str, limit: int = TREE_LIMIT) -> list[Promise]:
        return [self.codec.promise(r) for r in self._all("tree", origin, limit)]

    def promises(
        self, prefix: str, state: str | None, after: str | None, limit: int
    ) -> list[Promise]:
        low = max(prefix, after) if after is not None else prefix
        high = prefix + ID_END
        if state == PENDING:
            rows = self._all("pending_range", low, after or "", high, limit)
        elif state is None:
            rows = self._all("range", low, after or "", high, limit)
        else:
            rows = self._all("range_in_state", low, after or "", high, state, limit)
        return [self.codec.promise(r) for r in rows]

    def newest(self, prefix: str, limit: int) -> list[Promise]:
        rows = self._all("newest", prefix, prefix + ID_END, limit)
        return [self.codec.promise(r) for r in rows]

    def window(
        self, prefix: str, origin: str | None, after: str | None, size: int
    ) -> list[tuple[str, str, Tags]]:
        if origin is not None:
            rows = self._all("origin_window", origin, after or "", size)
        else:
            low = max(prefix, after) if after is not None else prefix
            rows = self._all("window", low, after or "", prefix + ID_END, size)
        return [(r[0], r[1], _TAGS.decode(r[2])) for r in rows]

    def promises_of(self, ids: Sequence[str]) -> list[Promise]:
        found: list[Promise] = []
        unique = list(dict.fromkeys(ids))
        for at in range(0, len(unique), IDS_PER_READ):
            chunk = unique[at : at + IDS_PER_READ]
            marks = ", ".join([self.mark] * len(chunk))
            sql = f"SELECT {PROMISE_COLS} FROM promises WHERE id IN ({marks})"
            found += [self.codec.promise(r) for r in self.cur.execute(sql, chunk).fetchall()]
        return sorted(found, key=lambda p: p.id)

    def deliveries(self, task_id: str, limit: int) -> list[OutboxRow]:
        return [self.codec.outbox_row(r) for r in self._all("deliveries", task_id, limit)]

    def outbox(self, state: str | None, before: int | None, limit: int) -> list[OutboxRow]:
        below = before if before is not None else 2**62
        if state is None:
            rows = self._all("outbox", below, limit)
        else:
            rows = self._all("outbox_in_state", state, below, limit)
        return [self.codec.outbox_row(r) for r in rows]

    def outbox_counts(self) -> dict[str, int]:
        return {str(s): int(n) for s, n in self._all("count_outbox")}

    def limits(self) -> list[LimitUse]:
        return [
            LimitUse(
                str(g),
                stored_limit(g, c, r, None).concurrency,
                int(u),
                int(h),
                None if r is None else float(r),
                None if k is None else int(k),
            )
            for g, c, r, k, u, h in self._all("limits")
        ]

    def held(self, ids: Sequence[str]) -> dict[str, Held]:
        found: dict[str, Held] = {}
        unique = list(dict.fromkeys(ids))
        for at in range(0, len(unique), IDS_PER_READ):
            chunk = unique[at : at + IDS_PER_READ]
            marks = ", ".join([self.mark] * len(chunk))
            sql = f"SELECT {HELD_COLS} FROM flow_held WHERE task_id IN ({marks})"
            for r in self.cur.execute(sql, chunk).fetchall():
                h = stored_held(*r)
                found[h.task_id] = h
        return found

    def key_in_use(self, group: str, key: str) -> int:
        r = self._one("key_in_use", group, key)
        return int(r[0]) if r is not None else 0

    def held_ahead(self, held: Held) -> int:
        g, pr, turn, at, id = held.group, held.priority, held.turn, held.created_at, held.task_id
        r = self._one("held_ahead", g, pr, pr, turn, turn, at, at, id)
        return int(r[0]) if r is not None else 0

    def counts(self) -> Counts:
        out: Counts = {}
        for table in ("promises", "tasks", "outbox"):
            out[table] = {str(s): int(n) for s, n in self._all(f"count_{table}")}
        r = self._one("count_schedules")
        out["schedules"] = {"all": int(r[0]) if r is not None else 0}
        return out


def _queries(p: str) -> dict[str, str]:
    """The inspection queries with ``p`` as the placeholder (``?`` or ``%s``)."""
    return {
        "promise": f"SELECT {PROMISE_COLS} FROM promises WHERE id = {p}",
        "trace": f"SELECT trace FROM promises WHERE id = {p}",
        "task": f"SELECT {TASK_COLS} FROM tasks WHERE id = {p}",
        "schedule": f"SELECT {SCHEDULE_COLS} FROM schedules WHERE id = {p}",
        "tree": f"SELECT {PROMISE_COLS} FROM promises WHERE origin = {p} ORDER BY id LIMIT {p}",
        # The range is [low, high), minus ``after`` itself (a page's last id).
        "range": (
            f"SELECT {PROMISE_COLS} FROM promises WHERE id >= {p} AND id > {p} AND id < {p}"
            f" ORDER BY id LIMIT {p}"
        ),
        "newest": (
            f"SELECT {PROMISE_COLS} FROM promises WHERE id >= {p} AND id < {p}"
            f" ORDER BY id DESC LIMIT {p}"
        ),
        "pending_range": (
            f"SELECT {PROMISE_COLS} FROM promises WHERE state = 'pending'"
            f" AND id >= {p} AND id > {p} AND id < {p} ORDER BY id LIMIT {p}"
        ),
        "range_in_state": (
            f"SELECT {PROMISE_COLS} FROM promises WHERE id >= {p} AND id > {p} AND id < {p}"
            f" AND state = {p} ORDER BY id LIMIT {p}"
        ),
        # A tag search's window: the columns it filters on, of the next ids in order.
        "window": (
            f"SELECT id, state, tags FROM promises WHERE id >= {p} AND id > {p} AND id < {p}"
            f" ORDER BY id LIMIT {p}"
        ),
        "origin_window": (
            f"SELECT id, state, tags FROM promises WHERE origin = {p} AND id > {p}"
            f" ORDER BY id LIMIT {p}"
        ),
        "deliveries": (
            f"SELECT {OUTBOX_COLS} FROM outbox WHERE task_id = {p} ORDER BY id DESC LIMIT {p}"
        ),
        "outbox": f"SELECT {OUTBOX_COLS} FROM outbox WHERE id < {p} ORDER BY id DESC LIMIT {p}",
        "outbox_in_state": (
            f"SELECT {OUTBOX_COLS} FROM outbox WHERE state = {p} AND id < {p}"
            f" ORDER BY id DESC LIMIT {p}"
        ),
        "count_promises": "SELECT state, count(*) FROM promises GROUP BY state",
        "count_tasks": "SELECT state, count(*) FROM tasks GROUP BY state",
        "count_outbox": "SELECT state, count(*) FROM outbox GROUP BY state",
        "count_schedules": "SELECT count(*) FROM schedules",
        # Flow control: each limit with a count of its slots and of its queue (both
        # index ranges: flow_slots_grp, flow_held_order).
        "limits": (
            "SELECT l.grp, l.concurrency, l.rate, l.per_key,"
            " (SELECT count(*) FROM flow_slots s WHERE s.grp = l.grp),"
            " (SELECT count(*) FROM flow_held h WHERE h.grp = l.grp)"
            " FROM flow_limits l ORDER BY l.grp"
        ),
        "key_in_use": f"SELECT count(*) FROM flow_slots WHERE grp = {p} AND fkey = {p}",
        # The queue before a held task, in flow_held_turn's order.
        "held_ahead": (
            f"SELECT count(*) FROM flow_held WHERE grp = {p} AND (priority > {p}"
            f" OR (priority = {p} AND (turn < {p} OR (turn = {p} AND (created_at < {p}"
            f" OR (created_at = {p} AND task_id < {p}))))))"
        ),
    }
