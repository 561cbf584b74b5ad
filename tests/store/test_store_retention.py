"""Retention on every store (store/retention.py): settled workflows are deleted a whole
tree at a time, only past the horizon, never a tree with a pending promise; the
archive sees a tree before it goes, and an archive that fails deletes nothing."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers import pg
from helpers.store_jobs import promise as make
from helpers.store_jobs import put, run
from troth.protocol.records import Execute, Task
from troth.store.base import Overlay, Store
from troth.store.retention import START, Swept, Tree
from troth.store.sqlite import SqliteStore

CUTOFF = 10_000


def workflow(store: Store, root: str, *, settled: int, pending_leaf: bool = False) -> None:
    """A root with a task and an execute row, two children (one with a task)."""
    origin = {"resonate:origin": root}
    leaf_state = "pending" if pending_leaf else "resolved"
    put(
        store,
        make(
            root, "resolved", tags={**origin, "resonate:target": "poll://any@g"}, settled_at=settled
        ),
        make(f"{root}.1", "resolved", tags=origin, settled_at=settled - 5),
        make(
            f"{root}.2",
            leaf_state,
            tags={**origin, "resonate:target": "poll://any@g"},
            settled_at=None if pending_leaf else settled - 1,
        ),
        Task(id=root, state="fulfilled", version=2),
        Task(id=f"{root}.2", state="pending" if pending_leaf else "fulfilled", version=1),
    )

    def message(tx: Overlay) -> None:
        tx.set_message("poll://any@g", Execute(f"{root}.2", 1))

    run(store, message)


def ids(store: Store) -> dict[str, list[str]]:
    snap = store.snapshot()
    return {
        "promises": [p["id"] for p in snap["promises"]],
        "tasks": [t["id"] for t in snap["tasks"]],
        "outbox": [r["message"].get("taskId", "") for r in snap["outbox"]],
    }


def sweep(store: Store, archive: Any = None, limit: int = 100) -> Swept:
    return store.retain(lambda r: r.sweep(CUTOFF, START, limit, archive))


def test_a_tree_settled_past_the_horizon_goes_whole(store: Store) -> None:
    workflow(store, "old", settled=CUTOFF - 100)
    workflow(store, "new", settled=CUTOFF + 100)  # within the horizon: kept
    put(store, make("alone", "rejected", settled_at=CUTOFF - 1))  # standalone, old
    swept = sweep(store)
    assert sorted(swept.deleted) == ["alone", "old"]
    assert (swept.trees, swept.promises, swept.tasks, swept.outbox) == (2, 4, 2, 1)
    assert swept.behind_ms == 100 and swept.cursor is None
    assert ids(store) == {
        "promises": ["new", "new.1", "new.2"],
        "tasks": ["new", "new.2"],
        "outbox": ["new.2"],
    }
    assert sweep(store).trees == 0  # nothing left to do


def test_a_tree_with_a_pending_promise_is_never_touched(store: Store) -> None:
    workflow(store, "live", settled=CUTOFF - 100, pending_leaf=True)
    before = store.snapshot()
    swept = sweep(store)
    assert swept.trees == 0 and swept.skipped == 1
    assert store.snapshot() == before


def test_the_archive_sees_each_tree_first_and_a_failed_archive_deletes_nothing(
    store: Store,
) -> None:
    workflow(store, "a", settled=CUTOFF - 100)
    workflow(store, "b", settled=CUTOFF - 50)
    before = store.snapshot()

    def broken(trees: Sequence[Tree]) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError):
        sweep(store, broken)
    assert store.snapshot() == before

    kept: list[dict[str, Any]] = []
    swept = sweep(store, lambda trees: kept.extend(t.as_json() for t in trees))
    assert swept.trees == 2
    assert [t["root"] for t in kept] == ["a", "b"]
    assert [p["id"] for p in kept[0]["promises"]] == ["a", "a.1", "a.2"]
    assert [t["id"] for t in kept[0]["tasks"]] == ["a", "a.2"]
    assert kept[0]["promises"][0]["state"] == "resolved"


def test_batches_resume_from_their_cursor(store: Store) -> None:
    for k in range(5):
        put(store, make(f"p{k}", "resolved", settled_at=CUTOFF - 100 + k))
    put(store, make("p-live", "pending"))
    first = store.retain(lambda r: r.sweep(CUTOFF, START, 2, None))
    assert first.deleted == ["p0", "p1"] and first.cursor == (CUTOFF - 99, "p1")
    assert first.cursor is not None
    cursor = first.cursor
    second = store.retain(lambda r: r.sweep(CUTOFF, cursor, 2, None))
    assert second.deleted == ["p2", "p3"]
    assert second.cursor is not None
    cursor = second.cursor
    third = store.retain(lambda r: r.sweep(CUTOFF, cursor, 2, None))
    assert third.deleted == ["p4"] and third.cursor is None
    assert ids(store)["promises"] == ["p-live"]


def test_a_new_sqlite_file_gives_deleted_pages_back(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    store = SqliteStore(db)
    try:
        assert store.conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
        big = "x" * 2000
        for k in range(300):
            put(store, make(f"p{k:03d}", "resolved", tags={"pad": big}, settled_at=CUTOFF - 1))
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        full = db.stat().st_size
        assert sweep(store, limit=1000).trees == 300
        assert store.reclaim(100_000) == 0  # no free page left
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert db.stat().st_size < full / 4
    finally:
        store.close()


def test_sqlite_gives_back_in_steps_and_keeps_a_spare_for_the_rows_to_come(
    tmp_path: Path,
) -> None:
    """Each step gives back at most the pages asked (a step holds the writer), says
    how many more it could give, and leaves ``spare`` of the file free; in the open
    transaction of a request batch (``reclaim_open``) it commits with that batch."""
    db = tmp_path / "t.db"
    store = SqliteStore(db)
    conn = store.conn

    def free() -> int:
        return int(conn.execute("PRAGMA freelist_count").fetchone()[0])

    def pages() -> int:
        return int(conn.execute("PRAGMA page_count").fetchone()[0])

    try:
        big = "x" * 2000
        for k in range(300):
            put(store, make(f"p{k:03d}", "resolved", tags={"pad": big}, settled_at=CUTOFF - 1))
        assert sweep(store, limit=1000).trees == 300
        before, freed = pages(), free()
        assert freed > 200
        left = store.reclaim(50, spare=0.25)
        assert (pages(), free()) == (before - 50, freed - 50)
        assert left > 10  # more to give back than the spare
        with store.lock:
            store.begin()
            assert store.reclaim_open(10, spare=0.25) > 0
            assert free() == freed - 60
            store.rollback()  # rolled back with its batch: nothing given back
        assert free() == freed - 50
        count = pages()
        assert store.reclaim(1000, spare=0.25) == 0  # all it may give, in one step
        assert free() == int(count * 0.25)  # the spare stays free (of the file it found)
        assert store.reclaim(1000, spare=0.25) == 0
    finally:
        store.close()


@pytest.mark.parametrize("table", ["promises", "tasks"])
def test_postgres_skips_a_tree_a_request_holds_a_row_of(pg_url: str, table: str) -> None:
    """A request that holds one row of a tree (its row lock) makes the whole tree wait
    for a later pass, never half of it; the other trees of the batch go."""
    store = pg.fresh_store(pg_url)
    try:
        workflow(store, "held", settled=100)
        workflow(store, "free", settled=200)
        with psycopg.connect(pg_url) as other:
            other.execute(f"SELECT 1 FROM {table} WHERE id = 'held.2' FOR UPDATE")
            first = sweep(store)
            assert (first.trees, first.skipped, first.deleted) == (1, 1, ["free"])
            assert "held.2" in ids(store)["promises"]
            assert "held" in ids(store)["tasks"]
        second = sweep(store)
        assert (second.trees, second.deleted) == (1, ["held"])
        assert ids(store) == {"promises": [], "tasks": [], "outbox": []}
    finally:
        store.close()


def test_sqlite_commits_a_batch_without_its_own_fsync_then_is_full_again(
    tmp_path: Path,
) -> None:
    """A retention batch commits with ``synchronous = NORMAL`` (idempotent work, made
    durable by the next request's fsync); every other commit stays FULL."""
    store = SqliteStore(tmp_path / "t.db")
    try:
        workflow(store, "wf", settled=100)
        seen: list[int] = []

        def batch(r: Any) -> Swept:
            seen.append(store.conn.execute("PRAGMA synchronous").fetchone()[0])
            return r.sweep(CUTOFF, START, 10, None)

        assert store.retain(batch).deleted == ["wf"]
        assert seen == [1]  # NORMAL while the batch ran
        assert store.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        with pytest.raises(RuntimeError):
            store.retain(lambda r: (_ for _ in ()).throw(RuntimeError("boom")))
        assert store.conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    finally:
        store.close()
