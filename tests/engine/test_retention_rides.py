"""Retention batches ride in request batches on SQLite (``Engine.exclusive``'s
``inside``): when requests wait, a retention batch runs in their transaction after
their jobs, under a savepoint, and shares their COMMIT instead of committing alone.

What must hold: the requests' guarantees are unchanged (they are committed and
answered as ever, also when the retention batch fails, which undoes only itself);
the retention batch is told its result only once the shared COMMIT has held, and
that COMMIT's failure is its failure too; with no request waiting it runs alone.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from helpers.store_jobs import CommitSpy, stored_ids
from troth.engine import Engine
from troth.machine.internal import Config
from troth.protocol.records import Promise, Value
from troth.store.base import Overlay
from troth.store.retention import START, Swept
from troth.store.sqlite import SqliteStore


def promise(id: str, *, settled: bool = False) -> Promise:
    return Promise(
        id=id,
        state="resolved" if settled else "pending",
        param=Value(),
        value=Value(),
        tags={},
        timeout_at=10**12,
        created_at=1,
        settled_at=2 if settled else None,
    )


def put(p: Promise) -> Any:
    def job(tx: Overlay) -> None:
        tx.set_promise(p)

    return job


def run(store: SqliteStore, body: Any) -> Any:
    async def main() -> Any:
        engine = Engine(store, Config())
        engine.paused = True  # no timer passes: every transaction here is the test's
        await engine.start()
        try:
            await engine.run(put(promise("old", settled=True)), 0)
            return await body(engine)
        finally:
            await engine.stop()

    return asyncio.run(main())


class Sweeper:
    """A retention batch that deletes every settled root, and says how it ran."""

    def __init__(self, store: SqliteStore, *, fail: bool = False) -> None:
        self.store = store
        self.fail = fail
        self.ran: list[str] = []
        self.saw: set[str] = set()

    def _sweep(self, r: Any) -> Swept:
        self.saw = {row[0] for row in self.store.conn.execute("SELECT id FROM promises")}
        swept: Swept = r.sweep(10**6, START, 10, None)
        if self.fail:
            raise ValueError("retention broke after deleting")
        return swept

    def alone(self) -> Swept:
        self.ran.append("alone")
        return self.store.retain(self._sweep)

    def inside(self) -> Swept:
        self.ran.append("inside")
        return self.store.retain_open(self._sweep)

    async def submit(self, engine: Engine) -> Swept:
        swept: Swept = await engine.exclusive(self.alone, here=True, inside=self.inside)
        return swept


def together(engine: Engine, sweeper: Sweeper, ids: list[str]) -> list[asyncio.Future[Any]]:
    """The retention batch and requests submitted in one pass of the loop: they wait
    together when the batch starts."""
    return [
        asyncio.ensure_future(sweeper.submit(engine)),
        *(asyncio.ensure_future(engine.run(put(promise(i)), 0)) for i in ids),
    ]


def test_it_rides_after_the_requests_jobs_and_shares_their_commit(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = CommitSpy(path)
    sweeper = Sweeper(store)

    async def body(engine: Engine) -> tuple[Swept, int, int, set[str]]:
        commits, batches = len(store.commit_threads), engine.stats.batches
        swept, *_ = await asyncio.gather(*together(engine, sweeper, ["r1", "r2"]))
        # Told only once the shared COMMIT held: another connection sees it.
        return (
            swept,
            len(store.commit_threads) - commits,
            engine.stats.batches - batches,
            stored_ids(path),
        )

    swept, commits, batches, after = run(store, body)
    assert sweeper.ran == ["inside"]
    assert {"r1", "r2"} <= sweeper.saw  # in the requests' transaction, after their jobs
    assert swept.deleted == ["old"]
    assert (commits, batches) == (1, 1)
    assert after == {"r1", "r2"}


def test_a_failing_retention_batch_undoes_only_itself(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = SqliteStore(path)
    sweeper = Sweeper(store, fail=True)

    async def body(engine: Engine) -> list[Any]:
        return await asyncio.gather(*together(engine, sweeper, ["r1"]), return_exceptions=True)

    rider, request = run(store, body)
    assert sweeper.ran == ["inside"]
    assert isinstance(rider, ValueError)
    assert request is None
    assert stored_ids(path) == {"old", "r1"}  # the request committed; the deletion did not


def test_a_failed_shared_commit_fails_the_retention_batch_too(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = CommitSpy(path)
    sweeper = Sweeper(store)

    async def body(engine: Engine) -> list[Any]:
        store.fail_commits = 1
        results = await asyncio.gather(
            *together(engine, sweeper, ["r1", "r2"]), return_exceptions=True
        )
        await engine.run(put(promise("next")), 0)  # the engine goes on
        return results

    results = run(store, body)
    assert sweeper.ran == ["inside"]
    assert all(isinstance(r, sqlite3.OperationalError) for r in results)
    assert stored_ids(path) == {"old", "next"}
    assert not store.lock.locked()


def test_with_no_request_waiting_it_runs_alone_on_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = SqliteStore(path)
    sweeper = Sweeper(store)

    async def body(engine: Engine) -> tuple[Swept, int]:
        thread = threading.get_ident()
        ran_on: list[int] = []
        alone = sweeper.alone

        def spy() -> Swept:
            ran_on.append(threading.get_ident())
            return alone()

        sweeper.alone = spy  # type: ignore[method-assign]
        swept = await sweeper.submit(engine)
        assert ran_on == [thread]
        return swept, len(stored_ids(path))

    swept, left = run(store, body)
    assert sweeper.ran == ["alone"]
    assert swept.deleted == ["old"]
    assert left == 0


@pytest.mark.parametrize("ids", [[], ["r1"]])
def test_work_without_inside_never_rides(tmp_path: Path, ids: list[str]) -> None:
    path = tmp_path / "t.db"
    store = CommitSpy(path)
    sweeper = Sweeper(store)

    async def body(engine: Engine) -> int:
        commits = len(store.commit_threads)
        futures = [
            asyncio.ensure_future(engine.exclusive(sweeper.alone, here=True)),
            *(asyncio.ensure_future(engine.run(put(promise(i)), 0)) for i in ids),
        ]
        await asyncio.gather(*futures)
        return len(store.commit_threads) - commits

    assert run(store, body) == 1 + bool(ids)
    assert sweeper.ran == ["alone"]
    assert stored_ids(path) == set(ids)
