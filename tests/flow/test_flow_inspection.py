"""The operator's reads of flow control (``Inspection.limits``, ``held``,
``held_ahead``: ``/metrics`` and ``troth explain`` use them) give the same answers on
every store.  The SQL is shared by SQLite and PostgreSQL (``store/inspection.py``), so
it runs on both here even though PostgreSQL does not set limits yet: the rows are
written straight into its schema-8 tables."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers import pg
from troth.flow.limits import Held, Limit
from troth.store.base import Store
from troth.store.inspection import Inspection, LimitUse
from troth.store.memory import MemoryStore
from troth.store.sqlite.store import SqliteStore

LIMITS = [("g", 3), ("h", 1), ("idle", 2)]
SLOTS = [("s1", "g"), ("s2", "g"), ("s3", "h")]
#: The queue of g is, in order: b (priority 5), d (first created), a, c (same
#: priority and creation as a: by id); h holds e.
HELD = [
    Held("a", "g", "poll://any@g", 0, 10),
    Held("b", "g", "poll://any@g", 5, 20),
    Held("c", "g", "poll://any@g", 0, 10),
    Held("d", "g", "poll://any@g", 0, 5),
    Held("e", "h", "poll://any@h", 0, 1),
]


def rows() -> dict[str, list[tuple[Any, ...]]]:
    return {
        "INSERT INTO flow_limits (grp, concurrency, updated_at) VALUES ({p}, {p}, 0)": LIMITS,
        "INSERT INTO flow_slots (task_id, grp) VALUES ({p}, {p})": SLOTS,
        "INSERT INTO flow_held (task_id, grp, address, priority, created_at)"
        " VALUES ({p}, {p}, {p}, {p}, {p})": [
            (h.task_id, h.group, h.address, h.priority, h.created_at) for h in HELD
        ],
    }


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "memory":
        m = MemoryStore()
        b = m.backend
        b.limits = {g: Limit(g, c) for g, c in LIMITS}
        for task, group in SLOTS:
            b.slots[task] = group
            b.in_use[group] += 1
        b.queued = {h.task_id: h for h in HELD}
        yield m
    elif request.param == "sqlite":
        s = SqliteStore(tmp_path / "inspect.db")
        for sql, values in rows().items():
            s.conn.executemany(sql.format(p="?"), values)
        yield s
        s.close()
    else:
        with (
            pg.throwaway_database("troth_flow_inspect") as url,
            psycopg.connect(url, autocommit=True) as conn,
        ):
            p = pg.fresh_store(url)  # the schema, migrated
            for sql, values in rows().items():
                conn.cursor().executemany(sql.format(p="%s"), values)
            try:
                yield p
            finally:
                p.close()


def read(ins: Inspection) -> tuple[list[LimitUse], dict[str, Held], dict[str, int]]:
    held = ins.held(["a", "b", "c", "d", "e", "nope", "s1"])
    return ins.limits(), held, {id: ins.held_ahead(h) for id, h in held.items()}


def test_limits_held_tasks_and_their_place_read_alike_on_every_store(store: Store) -> None:
    limits, held, ahead = store.inspect(read)
    assert limits == [
        LimitUse("g", 3, 2, 4),
        LimitUse("h", 1, 1, 1),
        LimitUse("idle", 2, 0, 0),
    ]
    assert held == {h.task_id: h for h in HELD}
    assert ahead == {"b": 0, "d": 1, "a": 2, "c": 3, "e": 0}
