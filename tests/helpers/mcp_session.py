"""MCP sessions with ``troth mcp`` opened by the ``mcp`` package's own client (the
``troth mcp`` tests, tests/mcp/): over stdio, the client starting ``troth mcp`` as
its child as an agent's host does, or over Streamable HTTP."""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from helpers.sdk_env import Proc, Procs
from helpers.support import free_port
from helpers.troth_process import TrothProcess

#: Every tool ``troth mcp`` lists.
TOOLS = {
    "promise-create",
    "promise-get",
    "promise-settle",
    "promise-search",
    "promise-wait",
    "invoke",
    "tree",
    "explain",
    "workers",
    "workflow-cancel",
    "schedule-create",
    "schedule-get",
    "schedule-delete",
    "schedule-search",
}


def b64(value: Any) -> str:
    return base64.b64encode(json.dumps(value, separators=(",", ":")).encode()).decode()


def mcp_argv(url: str, token: str | None = None, *more: str) -> list[str]:
    argv = ["-m", "troth.cli.main", "mcp", "--server", url, *more]
    if token is not None:
        argv += ["--token", token]
    return argv


@asynccontextmanager
async def stdio(url: str, token: str | None = None, *more: str) -> AsyncIterator[Client]:
    """An MCP session with ``troth mcp`` started over stdio by the client."""
    params = StdioServerParameters(command=sys.executable, args=mcp_argv(url, token, *more))
    async with Client(params) as client:
        yield client


def start_http(procs: Procs, url: str, token: str | None = None, name: str = "mcp") -> str:
    """``troth mcp --http`` as a child of the test; the URL of its ``/mcp`` endpoint."""
    port = free_port()
    proc: Proc = procs.start(name, [sys.executable, *mcp_argv(url, token, "--http", str(port))])
    endpoint = f"http://127.0.0.1:{port}/mcp"

    def listening() -> bool:
        if not proc.alive():
            procs.fail(f"{name} exited at startup")
        try:
            httpx.get(endpoint, timeout=1)
            return True
        except httpx.HTTPError:
            time.sleep(0.1)
            return False

    procs.wait_for(f"{name} to listen on {port}", listening, 30)
    return endpoint


@asynccontextmanager
async def http(endpoint: str, bearer: str | None = None) -> AsyncIterator[Client]:
    """An MCP session over Streamable HTTP, sending ``bearer`` as its own token."""
    headers = {"authorization": f"Bearer {bearer}"} if bearer else {}
    timeout = httpx2.Timeout(30, read=120)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as h,
        Client(streamable_http_client(endpoint, http_client=h)) as client,
    ):
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured answer; fails the test on a tool error."""
    result = await client.call_tool(tool, arguments)
    text = "".join(getattr(c, "text", "") for c in result.content)
    assert not result.is_error, (tool, arguments, text)
    answer: dict[str, Any] = result.structured_content
    return answer


async def refused(client: Client, tool: str, **arguments: Any) -> tuple[str, dict[str, Any]]:
    """A tool error's text and structured content; fails the test if it succeeded."""
    result = await client.call_tool(tool, arguments)
    text = "".join(getattr(c, "text", "") for c in result.content)
    assert result.is_error, (tool, arguments, text)
    return text, result.structured_content


def settle_from_outside(server: TrothProcess, id: str, value: Any) -> None:
    """A person approving: ``promise.settle`` straight to the server, not via MCP."""
    status, _ = server.call(
        "promise.settle", {"id": id, "state": "resolved", "value": {"data": b64(value)}}
    )
    assert status == 200
