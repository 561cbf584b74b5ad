"""The engine's deadline: a job that waited ``Engine.deadline`` seconds for its
batch's outcome is answered without it (``Engine._expire``).

What makes a request wait is real here: a writer busy with a long exclusive job (a
job queued behind it has not started), and a row lock another connection holds (a
job whose batch started waits in its locked read).  A job not started is answered
"not run" and never runs; one whose batch started is answered "unknown", and its
batch still commits when the lock goes.  Either begins an episode of store health
(``/ready`` 503), which the next committed write ends.  The same under a real
network cut: ``faults/test_network_cut_pg.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from helpers.pg import throwaway_database
from troth.engine import Engine
from troth.machine.internal import Config
from troth.protocol import requests as rq
from troth.store.faults import StoreFault
from troth.store.postgres import PostgresStore
from troth.store.sqlite import SqliteStore

pytestmark = pytest.mark.timeout(60)

HEAD = {"version": "2026-04-01"}
FAR = 10**13
DEADLINE = 0.4


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with throwaway_database("troth_deadline") as url:
        yield url


def exists(engine: Engine, id: str) -> bool:
    return engine.store.read(lambda tx: tx.get_promise(id)) is not None


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_a_job_that_never_started_is_answered_not_run_and_never_runs(
    kind: str, pg_url: str, tmp_path: Path
) -> None:
    async def run() -> None:
        store = PostgresStore(pg_url) if kind == "postgres" else SqliteStore(str(tmp_path / "t.db"))
        engine = Engine(store, Config())
        engine.deadline = DEADLINE
        await engine.start()
        try:
            busy = asyncio.ensure_future(engine.exclusive(lambda: time.sleep(2 * DEADLINE + 1)))
            await asyncio.sleep(0.05)  # the writer has taken it
            started = time.monotonic()
            create = rq.PromiseCreate(id=f"late-{kind}", timeout_at=FAR)
            with pytest.raises(StoreFault) as refused:
                await engine.request(create, 0, HEAD)
            waited = time.monotonic() - started
            assert DEADLINE <= waited < DEADLINE + 1.5  # checked every 0.25 s
            assert "did not answer within 0.4 s; the request was not run" in str(refused.value)
            assert engine.health.fault is not None
            assert engine.health.fault.reason == "unavailable"
            await busy
            await asyncio.sleep(0.1)  # the writer is past the job it must not run
            assert not await engine.exclusive(lambda: exists(engine, f"late-{kind}"))
            # The next write commits: the episode ends.
            ok = await engine.request(rq.PromiseCreate(id=f"next-{kind}", timeout_at=FAR), 0, HEAD)
            assert ok.status == 200
            assert engine.health.fault is None
        finally:
            await engine.stop()

    asyncio.run(run())


def test_a_job_whose_batch_started_is_answered_unknown_and_may_still_commit(
    pg_url: str,
) -> None:
    async def run() -> None:
        engine = Engine(PostgresStore(pg_url), Config())
        engine.deadline = DEADLINE
        await engine.start()
        try:
            await engine.request(rq.PromiseCreate(id="held", timeout_at=FAR), 0, HEAD)
            with psycopg.connect(pg_url) as other:
                # Another connection holds the promise's row: the batch's locked read
                # waits for it (without lock_timeout, backend.py).
                other.execute("SELECT 1 FROM promises WHERE id = 'held' FOR UPDATE")
                settle = rq.PromiseSettle(id="held", state="resolved")
                with pytest.raises(StoreFault) as refused:
                    await engine.request(settle, 0, HEAD)
                assert "whether the request took effect is unknown" in str(refused.value)
                other.rollback()
            # The lock went: the batch goes on and commits what the answer left open.
            for _ in range(100):
                found = await engine.request(rq.PromiseGet(id="held"), 0, HEAD)
                if found.data["promise"].state == "resolved":
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the settle never committed")
        finally:
            await engine.stop()

    asyncio.run(run())


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_a_node_that_is_only_behind_says_so_and_its_store_stays_healthy(
    kind: str, pg_url: str, tmp_path: Path
) -> None:
    """The writer keeps finishing work, just not this job's in time: the answer is
    503 all the same, but it blames the backlog, and no episode begins."""

    async def run() -> None:
        store = PostgresStore(pg_url) if kind == "postgres" else SqliteStore(str(tmp_path / "t.db"))
        engine = Engine(store, Config())
        engine.deadline = DEADLINE
        await engine.start()
        try:
            backlog = [
                asyncio.ensure_future(engine.exclusive(lambda: time.sleep(0.1))) for _ in range(12)
            ]
            await asyncio.sleep(0.05)
            create = rq.PromiseCreate(id=f"behind-{kind}", timeout_at=FAR)
            with pytest.raises(StoreFault) as refused:
                await engine.request(create, 0, HEAD)
            assert "waited 0.4 s for the store (the node is behind)" in str(refused.value)
            assert "the request was not run" in str(refused.value)
            assert engine.health.fault is None
            await asyncio.gather(*backlog)
        finally:
            await engine.stop()

    asyncio.run(run())
