"""The wait's streams (``troth.cli.mcp.listen``) in process, against a real server:
one stream serves every wait of a token, and a stream no wait used for a while is
closed when another token's is asked for (over HTTP each client brings its own)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from helpers.troth_process import LoggedServer
from troth.cli.mcp import listen
from troth.cli.remote import Remote

pytestmark = pytest.mark.timeout(60)


def test_streams_are_shared_and_idle_ones_closed(
    server: LoggedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote = Remote(server.url)
    for id in ("l-1", "l-2"):
        remote.ok(
            "promise.create",
            {"id": id, "timeoutAt": 10**13, "param": {}, "tags": {"resonate:external": "true"}},
        )

    async def call(kind: str, data: dict[str, Any]) -> Any:
        return await asyncio.to_thread(remote.ok, kind, data)

    async def scenario() -> None:
        listeners = listen.Listeners(server.url, "mcp")
        try:
            first = await listeners.stream(None)
            assert await listeners.stream(None) is first
            # Two waits on one stream, both woken by their own settlement.
            waits = [asyncio.create_task(first.wait(call, id, 30)) for id in ("l-1", "l-2")]
            while server.answered("promise.register_listener", 200) < 2:
                await asyncio.sleep(0.05)
            for id in ("l-2", "l-1"):
                await call("promise.settle", {"id": id, "state": "resolved", "value": {}})
            done = await asyncio.wait_for(asyncio.gather(*waits), 10)
            assert [d["promise"]["id"] for d in done] == ["l-1", "l-2"]
            assert all(d["settled"] for d in done)
            assert first.task is not None and not first.task.done()
            monkeypatch.setattr(listen, "IDLE", 0.0)
            await asyncio.sleep(0.01)
            other = await listeners.stream("another-token")
            assert other is not first and first.task.done()
            assert list(listeners.streams) == ["another-token"]
        finally:
            await listeners.close()

    asyncio.run(scenario())
