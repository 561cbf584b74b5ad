"""``troth mcp --http PORT``: the same tools over Streamable HTTP, bound to loopback,
driven by the ``mcp`` package's client; a wait there returns when the test settles
the promise from outside, as over stdio."""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx
import pytest

from helpers.mcp_session import TOOLS, call, http, settle_from_outside, start_http
from helpers.sdk_env import Procs
from helpers.troth_process import LoggedServer

pytestmark = pytest.mark.timeout(90)


def test_tools_and_a_wait_over_http(procs: Procs, server: LoggedServer) -> None:
    endpoint = start_http(procs, server.url)
    assert endpoint.startswith("http://127.0.0.1:")
    # Bound to loopback only: DNS rebinding protection refuses a foreign Host.
    foreign = httpx.post(endpoint, headers={"host": "evil.example"}, json={}, timeout=5)
    assert foreign.status_code in (403, 421), foreign.text

    async def scenario() -> None:
        async with http(endpoint) as client:
            listed = await client.list_tools()
            assert {t.name for t in listed.tools} == TOOLS
            await call(client, "promise-create", id="http-1", timeout="10m")
            answer: dict[str, Any] = {}
            started = time.monotonic()
            async with anyio.create_task_group() as tg:

                async def wait() -> None:
                    answer.update(await call(client, "promise-wait", id="http-1", timeout="60s"))

                tg.start_soon(wait)
                with anyio.fail_after(20):
                    while server.answered("promise.register_listener", 200) < 1:
                        await anyio.sleep(0.05)
                await anyio.to_thread.run_sync(settle_from_outside, server, "http-1", "yes")
            assert time.monotonic() - started < 30
            assert answer["settled"] is True and answer["decoded"]["value"] == "yes"

    anyio.run(scenario)
