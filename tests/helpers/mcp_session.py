"""MCP sessions with ``troth mcp`` opened by the ``mcp`` package's own client (the
``troth mcp`` tests, tests/mcp/): over stdio, the client starting ``troth mcp`` as
its child as an agent's host does, or over Streamable HTTP."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters


def mcp_argv(url: str, token: str | None = None, *more: str) -> list[str]:
    argv = ["-m", "troth.cli.main", "mcp", "--server", url, *more]
    if token is not None:
        argv += ["--token", token]
    return argv


@asynccontextmanager
async def stdio(url: str, token: str | None = None) -> AsyncIterator[Client]:
    """An MCP session with ``troth mcp`` started over stdio by the client."""
    params = StdioServerParameters(command=sys.executable, args=mcp_argv(url, token))
    async with Client(params) as client:
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
