"""Scans of one PostgreSQL transaction: promises, tasks and schedules by filter.

The scans' statements are the only ones built in code: their shape depends on the
filters a request gives (states, tags, a cursor, an origin), and each shape is built
once (:func:`_scan`).
"""

from __future__ import annotations

import functools
from abc import abstractmethod
from collections.abc import Collection
from typing import Any

from troth.protocol.records import PENDING, TAG_ORIGIN, Promise, Schedule, Tags, Task
from troth.store.backend import Backend
from troth.store.postgres.rows import CODEC, Q
from troth.store.postgres.session import NUL, Cur
from troth.store.sql.codec import PROMISE_COLS, SCHEDULE_COLS, TASK_COLS, json_text


def _scan_sql(
    table: str,
    columns: str,
    states: bool,
    tags_column: str | None,
    tags: bool,
    after: bool,
    origin: bool = False,
    pending: bool = False,
) -> str:
    """The scan's statement; with ``origin``, the indexed ``origin = …`` comes first
    (the ``resonate:origin`` tag, derived on every write); ``pending`` (the states are
    exactly pending) is written as a literal, which the partial index of pending
    promises matches (a parameter would not, in a generic plan)."""
    where: list[str] = ["origin = %(origin)s"] if origin else []
    if after:
        where.append("id > %(after)s")
    if pending:
        where.append("state = 'pending'")
    elif states:
        where.append("state = ANY(%(states)s)")
    if tags_column is not None and tags:
        # jsonb containment of a flat string map is "every pair is present"; any key
        # works (quotes, dots, colons), as with SQLite's json_each.
        where.append(f"{tags_column}::jsonb @> %(tags)s::jsonb")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {columns} FROM {table}{clause} ORDER BY id LIMIT %(limit)s"


@functools.cache
def _scan(
    table: str, states: bool, tags: bool, after: bool, origin: bool = False, pending: bool = False
) -> str:
    if table == "promises":
        return _scan_sql(table, PROMISE_COLS, states, "tags", tags, after, origin, pending)
    if table == "tasks":
        return _scan_sql(table, TASK_COLS, states, None, False, after)
    return _scan_sql(table, SCHEDULE_COLS, False, "promise_tags", tags, after)


def _after(after: str | None) -> str | None:
    """``id > after`` for stored ids, which never contain U+0000.

    For such an id, ``id > a + NUL + rest`` holds exactly when ``id > a``, so the
    cursor is cut at its first NUL (PostgreSQL cannot even receive one).
    """
    return None if after is None else after.split(NUL, 1)[0]


def _tags_filter(tags: Tags) -> str | None:
    """The jsonb filter text, or None when no stored row can match (a NUL in it)."""
    if any(NUL in k or NUL in v for k, v in tags.items()):
        return None
    return json_text(tags)


class Scans(Backend):
    """The scans of :class:`~troth.store.postgres.backend.PostgresBackend`, which
    supplies the cursor and :meth:`flush` (a scan must see the deferred writes)."""

    cur: Cur

    @abstractmethod
    def flush(
        self, *, commit: bool = False, fetch: tuple[str, Any] | None = None, begin: bool = False
    ) -> list[Any] | None: ...

    def _scan_rows(
        self,
        table: str,
        states: Collection[str] | None,
        tags: Tags,
        after: str | None,
        limit: int,
    ) -> list[tuple[Any, ...]] | None:
        """Rows of one scan; None when no stored row can match the filter."""
        self.flush()
        params: dict[str, Any] = {"limit": limit, "after": _after(after)}
        if states is not None:
            params["states"] = [s for s in states if NUL not in s]
            if not params["states"]:
                return None
        origin = tags.get(TAG_ORIGIN) if table == "promises" else None
        if origin is not None:
            if NUL in origin:
                return None
            params["origin"] = origin
            tags = {k: v for k, v in tags.items() if k != TAG_ORIGIN}
        if tags:
            params["tags"] = _tags_filter(tags)
            if params["tags"] is None:
                return None
        pending = table == "promises" and params.get("states") == [PENDING]
        sql = _scan(
            table, states is not None, bool(tags), after is not None, origin is not None, pending
        )
        return self.cur.execute(sql, params).fetchall()

    def scan_promises(
        self, states: Collection[str] | None, tags: Tags, after: str | None, limit: int
    ) -> list[Promise]:
        found = self._scan_rows("promises", states, tags, after, limit)
        return [] if found is None else [CODEC.promise(r) for r in found]

    def scan_tasks(
        self, states: Collection[str] | None, after: str | None, limit: int
    ) -> list[Task]:
        found = self._scan_rows("tasks", states, {}, after, limit)
        return [] if found is None else [CODEC.task(r) for r in found]

    def scan_schedules(self, tags: Tags, after: str | None, limit: int) -> list[Schedule]:
        found = self._scan_rows("schedules", None, tags, after, limit)
        return [] if found is None else [CODEC.schedule(r) for r in found]

    def promises_in_branch(self, branch: str, limit: int) -> list[Promise]:
        if not branch or NUL in branch:
            return []  # the empty branch is never indexed (memory/backend.py: ``if branch:``)
        self.flush()
        return [
            CODEC.promise(r) for r in self.cur.execute(Q["promises_in_branch"], (branch, limit))
        ]
