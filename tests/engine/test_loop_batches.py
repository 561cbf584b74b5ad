"""SQLite batches run on the event loop; only their COMMIT and exclusive work on the
writer thread (``Store.loop_batches``).

What must hold: requests waiting together still share one transaction (group
commit), a batch is answered only once its COMMIT returned, exclusive work runs
between batches and in submission order, a commit that fails fails its whole batch
and leaves nothing behind, and another process holding the file's write lock never
stalls the event loop (the batch waits on the writer thread instead).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.store_jobs import CommitSpy, stored_ids
from troth.engine import Commit, Engine
from troth.machine.internal import Config
from troth.protocol.records import Promise, Value
from troth.store.base import Overlay
from troth.store.memory import MemoryStore
from troth.store.sqlite import SqliteStore


def pending(id: str) -> Promise:
    return Promise(
        id=id,
        state="pending",
        param=Value(),
        value=Value(),
        tags={},
        timeout_at=10**12,
        created_at=0,
    )


def create(id: str) -> Any:
    """A job that stores promise ``id`` and says on which thread it ran."""

    def job(tx: Overlay) -> int:
        tx.set_promise(pending(id))
        return threading.get_ident()

    return job


@pytest.fixture
def path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "t.db"


def run(
    store: SqliteStore,
    body: Any,
    *,
    lone_here: bool = True,
    on_commit: Callable[[Commit], None] | None = None,
) -> Any:
    async def main() -> Any:
        engine = Engine(store, Config(), on_commit=on_commit, lone_commit_here=lone_here)
        engine.paused = True  # no timer passes: every transaction here is the test's
        await engine.start()
        try:
            return await body(engine)
        finally:
            await engine.stop()

    return asyncio.run(main())


def test_a_batch_runs_on_the_loop_and_commits_on_the_writer_thread(path: Path) -> None:
    store = CommitSpy(path)
    assert store.loop_batches

    async def body(engine: Engine) -> tuple[int, list[int], int]:
        loop_thread = threading.get_ident()
        threads = await asyncio.gather(*(engine.run(create(f"p{i}"), 0) for i in range(50)))
        assert set(threads) == {loop_thread}
        return loop_thread, store.commit_threads, engine.stats.batches

    loop_thread, commits, batches = run(store, body)
    assert stored_ids(path) == {f"p{i}" for i in range(50)}
    # Fifty requests submitted together: one transaction, one COMMIT, not on the loop.
    assert batches == 1
    assert len(commits) == 1
    assert commits[0] != loop_thread


def test_requests_arriving_during_a_commit_share_the_next_batch(path: Path) -> None:
    store = CommitSpy(path)
    gate = threading.Event()
    original = store.commit

    def slow_commit() -> None:
        gate.wait(10)  # the first COMMIT is held until more requests wait
        original()

    store.commit = slow_commit  # type: ignore[method-assign]

    async def body(engine: Engine) -> int:
        first = asyncio.ensure_future(engine.run(create("first"), 0))
        while not store.lock.locked():
            await asyncio.sleep(0.001)
        later = [asyncio.ensure_future(engine.run(create(f"l{i}"), 0)) for i in range(20)]
        await asyncio.sleep(0.05)
        # The loop is free while the COMMIT waits, and nothing is answered early.
        assert not first.done() and not any(f.done() for f in later)
        gate.set()
        await asyncio.gather(first, *later)
        return engine.stats.batches

    # The first batch is alone: held on the writer thread (lone_commit = writer).
    assert run(store, body, lone_here=False) == 2
    assert len(stored_ids(path)) == 21


def test_a_batch_alone_commits_on_the_loop_and_others_on_the_writer(path: Path) -> None:
    """``lone_commit = loop``: a request alone is committed where it ran, on the
    event loop (no hand-off to the writer thread and back), and answered after its
    COMMIT; requests submitted together still commit on the writer thread."""
    store = CommitSpy(path)

    async def body(engine: Engine) -> tuple[int, list[int]]:
        loop_thread = threading.get_ident()
        for i in range(3):
            await engine.run(create(f"alone{i}"), 0)
            assert stored_ids(path) >= {f"alone{i}"}  # answered once committed
        await asyncio.gather(*(engine.run(create(f"t{i}"), 0) for i in range(5)))
        return loop_thread, list(store.commit_threads)

    loop_thread, commits = run(store, body)
    assert commits[:3] == [loop_thread] * 3
    assert commits[3:] and all(t != loop_thread for t in commits[3:])
    assert len(stored_ids(path)) == 8


def test_a_failed_commit_of_a_batch_alone_fails_it_and_the_engine_goes_on(path: Path) -> None:
    store = CommitSpy(path)
    store.fail_commits = 1

    async def body(engine: Engine) -> None:
        with pytest.raises(sqlite3.OperationalError, match="injected"):
            await engine.run(create("lost"), 0)
        await engine.run(create("next"), 0)

    run(store, body)
    assert stored_ids(path) == {"next"}
    assert not store.lock.locked()


def test_exclusive_work_runs_between_batches_in_order(path: Path) -> None:
    store = SqliteStore(path)

    async def body(engine: Engine) -> tuple[bool, bool, int]:
        loop_thread = threading.get_ident()
        a = asyncio.ensure_future(engine.run(create("a"), 0))

        def look() -> tuple[bool, bool, int]:
            conn = store.conn
            ids = {row[0] for row in conn.execute("SELECT id FROM promises")}
            return "a" in ids, "b" in ids, threading.get_ident()

        seen = asyncio.ensure_future(engine.exclusive(look))
        b = asyncio.ensure_future(engine.run(create("b"), 0))
        await asyncio.gather(a, b)
        has_a, has_b, thread = await seen
        assert thread != loop_thread
        return has_a, has_b, engine.stats.batches

    has_a, has_b, batches = run(store, body)
    assert (has_a, has_b) == (True, False)
    assert batches == 2


def test_an_exclusive_error_reaches_its_caller_and_the_engine_goes_on(path: Path) -> None:
    store = SqliteStore(path)

    def broken() -> None:
        raise ValueError("exclusive broke")

    async def body(engine: Engine) -> None:
        with pytest.raises(ValueError, match="exclusive broke"):
            await engine.exclusive(broken)
        await engine.run(create("after"), 0)

    run(store, body)
    assert stored_ids(path) == {"after"}


def test_a_failed_commit_fails_the_whole_batch_and_keeps_nothing(path: Path) -> None:
    store = CommitSpy(path)
    store.fail_commits = 1

    async def body(engine: Engine) -> list[Any]:
        first = await asyncio.gather(
            *(engine.run(create(f"x{i}"), 0) for i in range(5)), return_exceptions=True
        )
        await engine.run(create("next"), 0)  # the connection came back, usable
        return first

    results = run(store, body)
    assert all(isinstance(r, sqlite3.OperationalError) for r in results)
    assert stored_ids(path) == {"next"}
    assert not store.lock.locked()


def test_another_writer_on_the_file_never_stalls_the_loop(path: Path) -> None:
    store = SqliteStore(path)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's write lock on the file

    async def body(engine: Engine) -> tuple[int, int]:
        loop_thread = threading.get_ident()
        job = asyncio.ensure_future(engine.run(create("waits"), 0))
        ticks = 0
        for _ in range(20):  # the loop keeps running while the write waits
            await asyncio.sleep(0.01)
            ticks += 1
        assert not job.done()
        other.execute("COMMIT")
        thread = await asyncio.wait_for(job, 10)
        assert thread != loop_thread  # it ran on the writer thread, which may wait
        await engine.run(create("then"), 0)  # and the loop takes batches again
        return ticks, engine.stats.batches

    try:
        ticks, batches = run(store, body)
    finally:
        other.close()
    assert ticks == 20
    assert batches == 2
    assert stored_ids(path) == {"waits", "then"}


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_a_failing_on_commit_hook_does_not_wedge_the_engine(path: Path, kind: str) -> None:
    """The hook runs on the writer thread after each commit (delivery's claim); an
    exception there is logged, and the engine keeps answering — with loop batches the
    connection still comes back to the loop."""
    store: Any = SqliteStore(path) if kind == "sqlite" else MemoryStore()
    calls: list[int] = []

    def broken(commit: Commit) -> None:
        calls.append(commit.jobs)
        raise RuntimeError("hook broke")

    async def body(engine: Engine) -> None:
        await engine.run(create("one"), 0)
        await asyncio.wait_for(engine.run(create("two"), 0), 10)

    run(store, body, on_commit=broken)
    assert calls == [1, 1]
