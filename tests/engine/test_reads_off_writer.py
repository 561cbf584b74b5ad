"""Read-only requests are answered off the writer: they never queue behind writes.

Point reads and searches on a SQLite file, and every read on PostgreSQL, are served
from reader connections: they answer while the writer thread is busy with something
else, and on PostgreSQL they take no row lock, so a row another session holds locked
does not make them wait.  They still see every commit acknowledged before them (the
differential tests compare every answer with the model's on all three backends).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from helpers import pg
from troth.server.config import Settings
from troth.server.run import build_app
from troth.store.faults import StoreUnavailable

HOUR = 3_600_000
READS = [
    ("promise.get", {"id": "p1"}),
    ("task.get", {"id": "p1"}),
    ("schedule.get", {"id": "s1"}),
    ("promise.search", {"idPrefix": "p"}),
    ("promise.search", {"state": "pending", "tags": {"k": "v"}}),
    ("task.search", {}),
    ("schedule.search", {}),
]


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with pg.throwaway_database("troth_reads") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "postgres":
        url = request.getfixturevalue("pg_url")
        pg.fresh_store(url).close()
        return Settings(store="postgres", postgres_url=url, access_log=False, ui=False)
    return Settings(store="sqlite", db=str(tmp_path / "t.db"), access_log=False, ui=False)


Body = Callable[[Any, httpx.AsyncClient], Awaitable[None]]


def served(settings: Settings, body: Body) -> None:
    """Run ``body(app, client)`` against a started app (in-process ASGI)."""

    async def main() -> None:
        app = build_app(settings)
        await app.startup()
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        try:
            await body(app, client)
        finally:
            await client.aclose()
            await app.shutdown()

    asyncio.run(main())


async def call(client: httpx.AsyncClient, kind: str, data: dict[str, Any]) -> dict[str, Any]:
    head = {"corrId": f"c-{kind}", "version": "2026-04-01"}
    reply = await client.post("/", json={"kind": kind, "head": head, "data": data})
    body: dict[str, Any] = reply.json()
    return body


async def seed(client: httpx.AsyncClient) -> None:
    """A promise with a task (it targets a poll address) and a schedule."""
    far = int(time.time() * 1000) + HOUR
    created = await call(
        client,
        "task.create",
        {
            "pid": "w1",
            "ttl": 60_000,
            "action": {
                "kind": "promise.create",
                "head": {"corrId": "inner", "version": "2026-04-01"},
                "data": {
                    "id": "p1",
                    "timeoutAt": far,
                    "param": {"headers": {}, "data": ""},
                    "tags": {"resonate:target": "poll://any@g", "k": "v"},
                },
            },
        },
    )
    assert created["head"]["status"] == 200, created
    schedule = {
        "id": "s1",
        "cron": "0 0 1 1 *",
        "promiseId": "s1.{{.timestamp}}",
        "promiseTimeout": HOUR,
        "promiseParam": {"headers": {}, "data": ""},
        "promiseTags": {},
    }
    assert (await call(client, "schedule.create", schedule))["head"]["status"] == 200


def test_reads_answer_while_the_writer_is_busy(settings: Settings) -> None:
    served(settings, reads_while_busy)


async def reads_while_busy(app: Any, client: httpx.AsyncClient) -> None:
    await seed(client)
    release = threading.Event()
    holding = asyncio.ensure_future(app.engine.exclusive(lambda: release.wait(30)))
    try:
        await asyncio.sleep(0.05)
        write = asyncio.ensure_future(
            call(client, "promise.create", {"id": "p2", "timeoutAt": 1, "param": {}, "tags": {}})
        )
        for kind, data in READS:
            body = await asyncio.wait_for(call(client, kind, data), 10)
            assert body["head"]["status"] == 200, (kind, body)
        page = await call(client, "promise.search", {"idPrefix": "p"})
        assert [p["id"] for p in page["data"]["promises"]] == ["p1"]
        tasks = (await call(client, "task.search", {}))["data"]["tasks"]
        assert [(t["id"], t["state"]) for t in tasks] == [("p1", "acquired")]
        assert not write.done(), "a write went around the busy writer"
    finally:
        release.set()
    await holding
    assert (await write)["head"]["status"] == 200


def test_reads_see_every_acknowledged_write(settings: Settings) -> None:
    served(settings, read_your_writes)


async def read_your_writes(_: Any, client: httpx.AsyncClient) -> None:
    far = int(time.time() * 1000) + HOUR
    for i in range(40):
        pid = f"r{i:02}"
        data = {"id": pid, "timeoutAt": far, "param": {}, "tags": {"n": str(i)}}
        assert (await call(client, "promise.create", data))["head"]["status"] == 200
        got = await call(client, "promise.get", {"id": pid})
        assert got["data"]["promise"]["state"] == "pending"
        found = await call(client, "promise.search", {"tags": {"n": str(i)}})
        assert [p["id"] for p in found["data"]["promises"]] == [pid]
        settle = {"id": pid, "state": "resolved", "value": {}}
        assert (await call(client, "promise.settle", settle))["head"]["status"] == 200
        done = await call(client, "promise.search", {"idPrefix": pid, "state": "resolved"})
        assert [p["id"] for p in done["data"]["promises"]] == [pid]


def test_a_reader_that_cannot_read_hands_over_to_the_writer(settings: Settings) -> None:
    """The fault (a reader that cannot start its transaction) is injected: a real one
    (WAL recovery, a lost PostgreSQL session) cannot be produced on demand."""
    served(settings, hand_over)


async def hand_over(app: Any, client: httpx.AsyncClient) -> None:
    await seed(client)

    def refuse(_: object) -> object:
        raise StoreUnavailable("reader refused (test)")

    app.engine.store.read_many = refuse
    app.engine.store.read_inline = refuse
    before = app.engine.stats.jobs
    for kind, data in READS:
        body = await call(client, kind, data)
        assert body["head"]["status"] == 200, (kind, body)
    assert app.engine.stats.jobs >= before + len(READS)


def test_postgres_reads_take_no_row_lock(pg_url: str) -> None:
    """A row another session holds FOR UPDATE (a request of another node) does not
    make a read wait: before, the read locked the row, waited out every attempt's
    lock_timeout and answered an error."""
    pg.fresh_store(pg_url).close()

    async def locked(_: Any, client: httpx.AsyncClient) -> None:
        await seed(client)
        with psycopg.connect(pg_url) as other:
            other.execute("SELECT 1 FROM promises WHERE id = 'p1' FOR UPDATE")
            other.execute("SELECT 1 FROM tasks WHERE id = 'p1' FOR UPDATE")
            other.execute("SELECT 1 FROM schedules WHERE id = 's1' FOR UPDATE")
            started = time.monotonic()
            for kind, data in READS:
                body = await call(client, kind, data)
                assert body["head"]["status"] == 200, (kind, body)
            assert time.monotonic() - started < 3.0
            other.rollback()

    served(Settings(store="postgres", postgres_url=pg_url, access_log=False, ui=False), locked)
