"""``POST /`` answered by the HTTP protocol itself, not through an ASGI cycle.

Almost every request troth serves is a ``POST /`` whose answer is one small JSON body
with two headers.  uvicorn answers any ASGI response generically: per response it
checks every header against two regular expressions, lower-cases and inspects each,
builds the head in a list and writes head and body in two ``transport.write`` calls
(two ``send`` syscalls).  That was a third of the event loop's time under load
(docs/benchmarks.md, "Profile").

So for ``POST /`` the protocol (:class:`DirectHttpToolsProtocol`) still parses the
request with uvicorn's httptools protocol (keep-alive, pipelining, flow control, body
reading, ``Expect: 100-continue``, the header and body deadlines of
``server/timeouts.py`` — all unchanged) and still runs troth's own
``App.protocol`` (body limit, decode, auth, engine, metrics, access log — the one
path every request takes), but hands it a ``send`` (:class:`DirectSend`) that writes
the head it knows is well-formed (troth made every header) and the body in one
write, then completes the cycle exactly as uvicorn's ``send`` does.

Everything else — other paths and methods, a CORS-enabled server (its headers are
added by a wrapper of ``send``), a request refused for uvicorn's concurrency limit —
takes uvicorn's ASGI path.  If a uvicorn upgrade removes the hook used here
(``_start_asgi_task``), every request takes the ASGI path: slower, never different
(``tests/wire/test_direct_post.py`` notices).
"""

from __future__ import annotations

import asyncio
import http
import logging
from typing import TYPE_CHECKING, Any, ClassVar

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from troth.server.timeouts import GuardedHttpToolsProtocol

if TYPE_CHECKING:
    from troth.server.app import App

log = logging.getLogger("troth.server")


def _status_line(code: int) -> bytes:
    try:
        phrase = http.HTTPStatus(code).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (code, phrase)


#: Status lines by code, made once.
STATUS_LINES = {code: _status_line(code) for code in range(100, 600)}


class DirectSend:
    """An ASGI ``send`` for one response of one head and one body (what
    ``App.protocol`` sends), written in one ``transport.write``."""

    __slots__ = ("cycle", "headers", "started", "status")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self.cycle = cycle
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.started = False

    async def __call__(self, message: Any) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = message.get("headers", [])
            self.started = True
            return
        if message.get("more_body", False):
            raise RuntimeError("DirectSend answers in one body; a streamed answer takes ASGI")
        cycle = self.cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if cycle.disconnected:
            return
        parts = [STATUS_LINES[self.status]]
        for name, value in cycle.default_headers:
            parts += (name, b": ", value, b"\r\n")
        for name, value in self.headers:
            parts += (name, b": ", value, b"\r\n")
        if not cycle.keep_alive:
            parts.append(b"connection: close\r\n")
        parts += (b"\r\n", message.get("body", b""))
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        cycle.transport.write(b"".join(parts))
        self.complete()

    def complete(self) -> None:
        """What uvicorn's ``send`` does after the last body: the connection may take
        its next request (or closes)."""
        cycle = self.cycle
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            cycle.transport.close()
        on_response, cycle.on_response = cycle.on_response, lambda: None
        on_response()


async def answer_directly(app: App, cycle: RequestResponseCycle) -> None:
    """One ``POST /`` through ``App.protocol`` with a :class:`DirectSend`."""
    send = DirectSend(cycle)
    try:
        await app.protocol(cycle.scope, cycle.receive, send)  # type: ignore[arg-type]
    except BaseException as exc:
        # App.protocol answers every request itself; reaching here is a bug.  Answer
        # as uvicorn would (500, close) and let cancellation through.
        log.error("POST / failed outside the envelope path", exc_info=exc)
        if not send.started and not cycle.disconnected and not cycle.transport.is_closing():
            body = b"Internal Server Error"
            cycle.keep_alive = False
            send.status, send.headers = (
                500,
                [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", b"%d" % len(body)),
                ],
            )
            await send({"type": "http.response.body", "body": body})
        elif not cycle.response_complete:
            cycle.transport.close()
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
            raise


class DirectHttpToolsProtocol(GuardedHttpToolsProtocol):
    """The guarded httptools protocol that answers ``POST /`` directly."""

    troth: ClassVar[App | None] = None
    #: ``{"direct": requests answered directly}`` (tests check that the path is
    #: taken).  A dict, not a class attribute bumped per request: assigning to a
    #: class attribute invalidates the interpreter's attribute cache of the class,
    #: and every later lookup on every connection would miss it.
    counts: ClassVar[dict[str, int]]

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        troth = type(self).troth
        scope = cycle.scope
        if (
            troth is not None
            and app is self.app
            and scope["method"] == "POST"
            and scope["path"] == "/"
            and troth.cors is None
        ):
            self.counts["direct"] += 1
            task = self.loop.create_task(answer_directly(troth, cycle))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)
            return
        super()._start_asgi_task(cycle, app)


def http_protocol(
    header_timeout: float, body_timeout: float, app: App | None
) -> type[DirectHttpToolsProtocol]:
    """The protocol class of one server: its own connection set and sweeper
    (``server/timeouts.py``), and ``POST /`` answered directly by ``app`` (None: every
    request takes ASGI)."""
    return type(
        "DirectHttpToolsProtocol",
        (DirectHttpToolsProtocol,),
        {
            "header_timeout": header_timeout,
            "body_timeout": body_timeout,
            "live": set(),
            "sweeping": None,
            "cut": 0,
            "troth": app,
            "counts": {"direct": 0},
        },
    )
