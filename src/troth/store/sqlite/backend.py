"""The SQLite backend: one transaction's reads and writes on the writer's connection
(``Backend``), its queries from ``queries.sql``, its rows ``store/sql/codec.py``'s with
integers beyond 64 bits stored as BLOBs (docs/architecture.md, "SQLite")."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection
from typing import Any, Final, Protocol, cast

from troth.flow.limits import Held, Limit, held_row, limit_row, stored_limit
from troth.protocol.records import EARLIEST, PENDING, TAG_ORIGIN, Promise, Schedule, Tags, Task
from troth.store.base import Backend
from troth.store.sql.codec import PROMISE_COLS, SCHEDULE_COLS, TASK_COLS, RowCodec
from troth.store.sql.queries import load_queries
from troth.store.writes import Writes

__all__ = ["CODEC", "Q", "SqliteBackend", "int_in", "int_out"]

# -- integers ---------------------------------------------------------------------------

I64_MIN: Final = -(2**63)
I64_MAX: Final = 2**63 - 1


def int_in(n: int | None) -> int | bytes | None:
    """An integer as SQLite can store it: beyond 64 bits a BLOB that sorts after every
    INTEGER and, among BLOBs, numerically (docs/architecture.md, "SQLite")."""
    if n is None or I64_MIN <= n <= I64_MAX:
        return n
    if n < 0:
        raise OverflowError(f"integer {n} is below -2**63 and cannot be stored")
    size = (n.bit_length() + 7) // 8
    return size.to_bytes(4, "big") + n.to_bytes(size, "big")


def int_out(v: Any) -> Any:
    """Inverse of :func:`int_in` (``int``, ``None``, or a BLOB-encoded big int)."""
    if v.__class__ is bytes:
        size = int.from_bytes(v[:4], "big")
        return int.from_bytes(v[4 : 4 + size], "big")
    return v


Q: Final = load_queries("troth.store.sqlite")
#: Rows as SQLite keeps them (``store/sql/codec.py`` with integers beyond 64 bits as BLOBs).
CODEC: Final = RowCodec(int_in=int_in, int_out=int_out, flag=int)


def tag_filter(table: str, column: str) -> str:
    """One ``key = value`` pair of a tag filter.

    ``json_each`` compares the decoded key, so any key works (``resonate:origin``,
    keys with quotes or dots), which a ``json_extract`` path cannot promise.
    """
    return f"EXISTS (SELECT 1 FROM json_each({table}.{column}) WHERE key = ? AND value = ?)"


def scan_sql(
    table: str,
    columns: str,
    states: int | None,
    tags_column: str | None,
    tags: int,
    after: bool,
    origin: bool = False,
    pending: bool = False,
) -> str:
    """The scan's statement; with ``origin``, the first condition is the indexed
    ``origin = ?`` (the ``resonate:origin`` tag, derived on every write); ``pending``
    (the states are exactly pending) is a literal, which the partial index of pending
    promises matches (the planner cannot see through a bound parameter)."""
    where: list[str] = ["origin = ?"] if origin else []
    if after:
        where.append("id > ?")
    if pending:
        where.append("state = 'pending'")
    elif states is not None:
        where.append(f"state IN ({', '.join('?' * states)})")
    if tags_column is not None:
        where.extend(tag_filter(table, tags_column) for _ in range(tags))
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {columns} FROM {table}{clause} ORDER BY id LIMIT ?"


def scan_params(
    after: str | None, states: Collection[str] | None, tags: Tags, limit: int
) -> list[Any]:
    params: list[Any] = []
    if after is not None:
        params.append(after)
    if states is not None:
        params.extend(states)
    for k, v in tags.items():
        params.extend((k, v))
    params.append(limit)
    return params


# -- the backend -----------------------------------------------------------------------------


class Executes(Protocol):
    """What :class:`SqliteBackend` uses of its connection."""

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor: ...


def settles(old: Promise, new: Promise) -> bool:
    """Whether ``new`` differs from ``old`` (the row as it stands) at most in state,
    value and settled_at.  The other fields are compared by identity: a settle keeps
    the old row's objects (``msgspec.structs.replace``); anything else takes the
    full write, which is never wrong."""
    return (
        old.param is new.param
        and old.tags is new.tags
        and old.callbacks is new.callbacks
        and old.listeners is new.listeners
        and old.timeout_at == new.timeout_at
        and old.created_at == new.created_at
    )


class SqliteBackend(Backend):
    """Reads and writes of the transaction that :meth:`SqliteStore.begin` opened.

    The writer's backend (``known`` not None) keeps the promise rows the transaction
    read or wrote, as they stand in it: a write that only settles one of them
    (:func:`settles`) updates the four columns a settle changes instead of
    rewriting all fourteen (a third less SQLite time, and no JSON for the others).
    ``known`` is emptied when a transaction begins."""

    def __init__(self, conn: Executes, *, known: bool = False) -> None:
        self.conn = conn
        self.known: dict[str, Promise] | None = {} if known else None

    # -- reads ------------------------------------------------------------------------

    def get_promise(self, id: str) -> Promise | None:
        r = self.conn.execute(Q["get_promise"], (id,)).fetchone()
        if r is None:
            return None
        p = CODEC.promise(r)
        if self.known is not None:
            self.known[id] = p
        return p

    def get_task(self, id: str) -> Task | None:
        r = self.conn.execute(Q["get_task"], (id,)).fetchone()
        return None if r is None else CODEC.task(r)

    def get_schedule(self, id: str) -> Schedule | None:
        r = self.conn.execute(Q["get_schedule"], (id,)).fetchone()
        return None if r is None else CODEC.schedule(r)

    def get_trace(self, id: str) -> str | None:
        r = self.conn.execute(Q["get_trace"], (id,)).fetchone()
        return None if r is None else cast(str | None, r[0])

    def scan_promises(
        self, states: Collection[str] | None, tags: Tags, after: str | None, limit: int
    ) -> list[Promise]:
        if states is not None and not states:
            return []
        origin = tags.get(TAG_ORIGIN)
        if origin is not None:
            tags = {k: v for k, v in tags.items() if k != TAG_ORIGIN}
        pending = states is not None and set(states) == {PENDING}
        if pending:
            states = None
        sql = scan_sql(
            "promises",
            PROMISE_COLS,
            None if states is None else len(states),
            "tags",
            len(tags),
            after is not None,
            origin is not None,
            pending,
        )
        params = scan_params(after, states, tags, limit)
        if origin is not None:
            params.insert(0, origin)
        rows = self.conn.execute(sql, params).fetchall()
        return [CODEC.promise(r) for r in rows]

    def scan_tasks(
        self, states: Collection[str] | None, after: str | None, limit: int
    ) -> list[Task]:
        if states is not None and not states:
            return []
        sql = scan_sql(
            "tasks", TASK_COLS, None if states is None else len(states), None, 0, after is not None
        )
        rows = self.conn.execute(sql, scan_params(after, states, {}, limit)).fetchall()
        return [CODEC.task(r) for r in rows]

    def scan_schedules(self, tags: Tags, after: str | None, limit: int) -> list[Schedule]:
        sql = scan_sql(
            "schedules", SCHEDULE_COLS, None, "promise_tags", len(tags), after is not None
        )
        rows = self.conn.execute(sql, scan_params(after, None, tags, limit)).fetchall()
        return [CODEC.schedule(r) for r in rows]

    def promises_in_branch(self, branch: str, limit: int) -> list[Promise]:
        if not branch:
            return []  # the empty branch is never indexed (memory/backend.py: ``if branch:``)
        rows = self.conn.execute(Q["promises_in_branch"], (branch, limit)).fetchall()
        return [CODEC.promise(r) for r in rows]

    # -- deadlines ----------------------------------------------------------------------

    def _ids(self, sql: str, params: tuple[Any, ...]) -> list[str]:
        return [r[0] for r in self.conn.execute(sql, params)]

    # ``since`` is left unused: SQLite updates its indexes in place, so the low end of
    # a deadline index holds no dead entry to skip.

    def due_promises(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        return self._ids(Q["due_promises"], (int_in(now), limit))

    def due_tasks(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        return self._ids(Q["due_tasks"], (int_in(now), limit))

    def due_schedules(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        return self._ids(Q["due_schedules"], (int_in(now), limit))

    def undrained_promises(self, limit: int) -> list[str]:
        return self._ids(Q["undrained_promises"], (limit,))

    def next_deadline(self) -> int | None:
        undrained, *armed = self.conn.execute(Q["next_deadline"]).fetchone()
        candidates: list[int] = [int_out(d) for d in armed if d is not None]
        if undrained:
            candidates.append(0)
        return min(candidates) if candidates else None

    # -- writes -------------------------------------------------------------------------

    # -- flow control ---------------------------------------------------------------

    def flow_limits(self) -> list[Limit]:
        rows = self.conn.execute(Q["flow_limits"]).fetchall()
        return [stored_limit(*row) for row in rows]

    def flow_tat(self, group: str) -> float:
        r = self.conn.execute(Q["flow_tat"], (group,)).fetchone()
        return 0.0 if r is None else float(r[0])

    def flow_slot(self, task_id: str) -> str | None:
        r = self.conn.execute(Q["flow_slot"], (task_id,)).fetchone()
        return None if r is None else str(r[0])

    def flow_in_use(self, group: str) -> int:
        return int(self.conn.execute(Q["flow_in_use"], (group,)).fetchone()[0])

    def flow_slots_of(self, group: str) -> list[str]:
        rows = self.conn.execute(Q["flow_slots_of"], (group,)).fetchall()
        return [str(r[0]) for r in rows]

    def flow_held(self, group: str, limit: int, offset: int = 0) -> list[Held]:
        rows = self.conn.execute(Q["flow_held"], (group, limit, offset)).fetchall()
        return [Held(*row) for row in rows]

    def flow_queued(self, task_id: str) -> Held | None:
        r = self.conn.execute(Q["flow_queued"], (task_id,)).fetchone()
        return None if r is None else Held(*r)

    def flow_key_in_use(self, group: str, key: str) -> int:
        return int(self.conn.execute(Q["flow_key_in_use"], (group, key)).fetchone()[0])

    def flow_key_turn(self, group: str, key: str) -> int:
        r = self.conn.execute(Q["flow_key_turn"], (group, key)).fetchone()
        return 0 if r is None or r[0] is None else int(r[0])

    def flow_turn(self, group: str) -> int:
        r = self.conn.execute(Q["flow_turn"], (group,)).fetchone()
        return 0 if r is None else int(r[0])

    def flow_held_count(self, group: str) -> int:
        return int(self.conn.execute(Q["flow_held_count"], (group,)).fetchone()[0])

    def _apply_flow(self, writes: Writes, now: int) -> None:
        execute = self.conn.execute
        for key in writes.withdrawn or ():
            execute(Q["delete_pending_message"], (key,))
        keys = writes.slot_keys or {}
        for task_id, group in (writes.slots or {}).items():
            if group is None:
                execute(Q["flow_delete_slot"], (task_id,))
            else:
                execute(Q["flow_put_slot"], (task_id, group, keys.get(task_id, "")))
        for task_id, held in (writes.held or {}).items():
            if held is None:
                execute(Q["flow_delete_held"], (task_id,))
            else:
                execute(Q["flow_put_held"], held_row(held))
        for group, limit in (writes.limits or {}).items():
            if limit is None:
                execute(Q["flow_delete_limit"], (group,))
                execute(Q["flow_delete_group_slots"], (group,))
            else:
                execute(Q["flow_put_limit"], limit_row(limit, now))
        for group, tat in (writes.tats or {}).items():
            execute(Q["flow_put_tat"], (tat, group))
        for group, turn in (writes.turns or {}).items():
            execute(Q["flow_put_turn"], (turn, group))

    def apply(self, writes: Writes, now: int) -> None:
        execute = self.conn.execute
        known = self.known
        for p in writes.promises.values():
            if known is not None:
                old = known.get(p.id)
                known[p.id] = p
                if old is not None and settles(old, p):
                    execute(Q["settle_promise"], CODEC.settle_row(p))
                    continue
            execute(Q["upsert_promise"], CODEC.promise_row(p))
        if writes.traces:
            for id, trace in writes.traces.items():
                execute(Q["set_trace"], (trace, id))
        for t in writes.tasks.values():
            execute(Q["upsert_task"], CODEC.task_row(t))
        for id, s in writes.schedules.items():
            if s is None:
                execute(Q["delete_schedule"], (id,))
            else:
                execute(Q["upsert_schedule"], CODEC.schedule_row(s))
        held = writes.available_at
        for key, entry in writes.messages.items():
            execute(Q["delete_pending_message"], (key,))
            row = CODEC.message_row(key, entry, now, held.get(key) if held else None)
            execute(Q["insert_message"], row)
        if writes.has_flow():
            self._apply_flow(writes, now)

    # -- whole-store reads -----------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything, in the memory store's ``snapshot()`` format (built from the same Structs)."""
        return CODEC.snapshot(lambda sql: self.conn.execute(sql).fetchall())


# -- the store ---------------------------------------------------------------------------------
