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
from typing import Any, Final

from troth.outbox.rows import OutboxRow
from troth.protocol.records import PENDING, Promise, Schedule, Task
from troth.store.codec import OUTBOX_COLS, PROMISE_COLS, SCHEDULE_COLS, TASK_COLS, RowCodec
from troth.store.outbox import Cursor

#: Sorts after every character (UTF-8 F4 8F BF BF): ``prefix + ID_END`` bounds the ids
#: that start with ``prefix`` (both stores compare ids bytewise).
ID_END: Final = "\U0010ffff"
#: Ids one ``IN (…)`` read takes (well under SQLite's and psycopg's parameter limits).
IDS_PER_READ: Final = 500
#: Rows one tree read returns at most (a workflow larger than this is cut, and says so).
TREE_LIMIT: Final = 5000

Counts = dict[str, dict[str, int]]


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

    def deliveries(self, task_id: str, limit: int) -> list[OutboxRow]:
        return [self.codec.outbox_row(r) for r in self._all("deliveries", task_id, limit)]

    def outbox(self, state: str | None, before: int | None, limit: int) -> list[OutboxRow]:
        below = before if before is not None else 2**62
        if state is None:
            rows = self._all("outbox", below, limit)
        else:
            rows = self._all("outbox_in_state", state, below, limit)
        return [self.codec.outbox_row(r) for r in rows]

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
    }
