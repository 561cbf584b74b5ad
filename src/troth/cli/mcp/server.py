"""The MCP server of ``troth mcp``, on the official ``mcp`` package (``troth[mcp]``):
the tools of ``tools.py`` and ``promise-wait`` (``listen.py``), over stdio or
Streamable HTTP.

Every tool call is a client of the configured server exactly as the client
commands are (``Remote``: ``POST /`` and ``GET /ops/…``), run in a worker thread so
that one slow call never holds up another, with the configured token — or, over
HTTP, the token the MCP client sent itself as ``Authorization: Bearer``.  A refusal
comes back as a tool error carrying the server's status and message; nothing else
an agent sees carries a stack trace (the log on stderr does).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

import anyio
import anyio.to_thread
import jsonschema  # type: ignore[import-untyped]
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from troth import __version__
from troth.cli.mcp.listen import Listeners
from troth.cli.mcp.tools import BY_NAME, TOOLS, WAIT, Tool, ToolError, with_decoded
from troth.cli.remote import Remote, RemoteError, Unreachable
from troth.durations import parse_duration

log = logging.getLogger("troth.mcp")

#: How long ``promise-wait`` waits unless told.
DEFAULT_WAIT: Final = "60s"
#: What an agent can do about a promise that takes no listener.
NOT_EXTERNAL: Final = (
    " (promise-wait works on external promises: made by promise-create or invoke, "
    "targeted, timers, or tagged resonate:external=true; read this one with promise-get)"
)
#: Seconds between progress notifications of a long wait.
PROGRESS_EVERY: Final = 10.0

INSTRUCTIONS: Final = (
    "Durable promises and durable functions on a Resonate server (troth). A promise is "
    "a value that will exist later, settled by whoever holds its id. To wait for a "
    "person or a service: promise-create, tell them the id, then promise-wait (repeat "
    "while it answers settled=false). To run work that survives crashes: invoke a "
    "function registered by a worker group, then promise-wait on the call's id. "
    "explain says why a workflow is stuck; tree shows how far it got."
)


@dataclass
class Config:
    server: str
    token: str | None
    listen_group: str
    timeout: float = 30.0


@dataclass
class State:
    config: Config
    listeners: Listeners


def build(config: Config) -> Server[State]:
    """The MCP server: its tools, and the listeners' streams for its lifetime."""

    @asynccontextmanager
    async def lifespan(_: Server[State]) -> AsyncIterator[State]:
        listeners = Listeners(config.server, config.listen_group)
        try:
            yield State(config, listeners)
        finally:
            await listeners.close()

    async def list_tools(
        ctx: ServerRequestContext[State], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[_describe(t) for t in TOOLS])

    async def call_tool(
        ctx: ServerRequestContext[State], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        state = ctx.lifespan_context
        remote = Remote(state.config.server, _token(ctx, state.config), state.config.timeout)
        try:
            answer = await _call(ctx, remote, params.name, params.arguments or {})
        except ToolError as exc:
            return _error(str(exc), {"error": str(exc)})
        except RemoteError as exc:
            text = f"{exc.kind} refused: {exc.status} {exc.message}"
            return _error(text, {"status": exc.status, "message": exc.message, "kind": exc.kind})
        except Unreachable as exc:
            return _error(str(exc), {"error": str(exc)})
        except Exception as exc:  # an agent gets a sentence; the log keeps the trace
            log.exception("tool %s failed", params.name)
            text = f"internal error in {params.name}: {type(exc).__name__}: {exc}"
            return _error(text, {"error": text})
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(answer, indent=2, ensure_ascii=False))],
            structured_content=answer if isinstance(answer, dict) else {"result": answer},
        )

    return Server(
        "troth",
        version=__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _describe(tool: Tool) -> types.Tool:
    return types.Tool(
        name=tool.name,
        description=tool.description,
        input_schema=tool.schema,
        annotations=types.ToolAnnotations(
            read_only_hint=tool.read_only,
            destructive_hint=tool.destructive,
            idempotent_hint=tool.idempotent,
            open_world_hint=False,
        ),
    )


def _token(ctx: ServerRequestContext[State], config: Config) -> str | None:
    """The MCP client's own bearer token over HTTP, else the configured one."""
    headers = getattr(ctx.request, "headers", None)
    if headers is not None:
        auth = str(headers.get("authorization") or "")
        if auth.lower().startswith("bearer ") and auth[7:].strip():
            return auth[7:].strip()
    return config.token


def _error(text: str, structured: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=text)], structured_content=structured, is_error=True
    )


async def _call(
    ctx: ServerRequestContext[State], remote: Remote, name: str, args: dict[str, Any]
) -> Any:
    tool = BY_NAME.get(name)
    if tool is None:
        raise ToolError(f"no tool {name!r}; the tools are {', '.join(BY_NAME)}")
    try:
        jsonschema.validate(args, tool.schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise ToolError(f"{name}: {where + ': ' if where else ''}{exc.message}") from None
    if tool.handler is not None:
        handler = tool.handler
        return await anyio.to_thread.run_sync(lambda: handler(remote, args))
    assert name == WAIT
    try:
        seconds = parse_duration(args.get("timeout") or DEFAULT_WAIT) / 1000
    except ValueError as exc:
        raise ToolError(f"timeout: {exc}") from None

    async def call(kind: str, data: dict[str, Any]) -> Any:
        return await anyio.to_thread.run_sync(lambda: remote.ok(kind, data))

    stream = await ctx.lifespan_context.listeners.stream(remote.token)
    answer: dict[str, Any] = {}
    failure: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_progress, ctx, args["id"], seconds)
        try:
            answer = await stream.wait(call, args["id"], seconds)
        except RemoteError as exc:  # raised below, not wrapped in the group's ExceptionGroup
            failure = exc
            if exc.status == 422 and exc.kind == "promise.register_listener":
                failure = RemoteError(exc.kind, exc.status, f"{exc.message}{NOT_EXTERNAL}")
        except Exception as exc:
            failure = exc
        tg.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return with_decoded(answer)


async def _progress(ctx: ServerRequestContext[State], id: str, seconds: float) -> None:
    """Progress notifications while a wait sleeps, for a client that asked for them
    (a progress token): hosts that reset their tool-call timeout on progress then let
    a long wait run.  Every 10 s (more often for a short wait); nothing is sent to the
    server of the protocol."""
    every = min(PROGRESS_EVERY, max(1.0, seconds / 4))
    waited = 0.0
    while waited + every < seconds:
        await anyio.sleep(every)
        waited += every
        try:
            await ctx.session.report_progress(waited, seconds, f"waiting for {id} to settle")
        except Exception:  # the client went away: the wait itself will end
            return


# -- transports -------------------------------------------------------------------------------


def serve_stdio(config: Config) -> None:
    server = build(config)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


def serve_http(config: Config, host: str, port: int) -> None:
    import uvicorn

    server = build(config)
    app = server.streamable_http_app(host=host)
    uvicorn.run(app, host=host, port=port, log_level="warning")
