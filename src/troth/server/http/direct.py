"""``POST /`` answered by the HTTP protocol itself, not through an ASGI cycle.

Almost every request troth serves is a ``POST /`` whose answer is one small JSON body
with two headers.  uvicorn answers any ASGI response generically: per response it
checks every header against two regular expressions, lower-cases and inspects each,
builds the head in a list and writes head and body in two ``transport.write`` calls
(two ``send`` syscalls).  That was a third of the event loop's time under load
(docs/performance-notes.md, "POST / without ASGI").

So for ``POST /`` the protocol (:class:`DirectHttpToolsProtocol`) still parses the
request with uvicorn's httptools protocol (keep-alive, pipelining, flow control, body
reading, ``Expect: 100-continue``, the header and body deadlines of
``server/http/timeouts.py`` — all unchanged) and still runs troth's own
``App.protocol`` (body limit, decode, auth, engine, metrics, access log — the one
path every request takes), but hands it a ``send`` (:class:`DirectSend`) that writes
the head it knows is well-formed (troth made every header) and the body in one
write, then completes the cycle exactly as uvicorn's ``send`` does.

A *simple* ``POST /`` is not even parsed by httptools (:func:`simple_request`): the
request line exactly ``POST / HTTP/1.1``, well-formed header lines, a
``Content-Length`` body that arrived whole and fits ``max_body``, and none of
``Transfer-Encoding``, ``Expect``, ``Upgrade``.  Two regular expressions in C read it
where httptools calls back into Python for the message, the URL, every header, the
end of the headers, the body and the end of the message, and uvicorn builds an ASGI
scope, a cycle, an event and a receive channel.  The first request on a connection
that is not simple — a head or body split across reads, a chunked or oversized body,
HTTP/1.0, ``Expect: 100-continue``, anything malformed — hands that connection to
httptools for good, from that request on (never in the middle of one), so whatever
is unusual is parsed and answered exactly as before.  Pipelined requests wait until
the answer before them is written, as uvicorn's pipeline does.  A simple request
has no task, coroutine, cycle or send of its own: ``Envelopes.answer_soon`` returns
its answer when nothing waits (a refusal, a SQLite point read), or calls back when
the request's batch committed, and :meth:`DirectHttpToolsProtocol.reply` — the one
writer of a simple request's answer — writes it.

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
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from troth.protocol.envelope import encode_response
from troth.server.http.asgi import json_headers
from troth.server.http.timeouts import IDLE, KEPT, GuardedHttpToolsProtocol
from troth.server.ingress.envelope import Answer

if TYPE_CHECKING:
    from troth.server.http.app import App

log = logging.getLogger("troth.server")


def _status_line(code: int) -> bytes:
    try:
        phrase = http.HTTPStatus(code).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (code, phrase)


#: Status lines by code, made once.
STATUS_LINES = {code: _status_line(code) for code in range(100, 600)}


#: A simple request's head: the request line, then header lines of a token, a colon
#: and a value without control characters (tab allowed), then the empty line.  It
#: cannot backtrack: a line's characters are either value or its CRLF.
_SIMPLE_HEAD = re.compile(
    rb"POST / HTTP/1\.1\r\n((?:[-!#$%&'*+.^_`|~0-9A-Za-z]+:[^\x00-\x08\x0a-\x1f\x7f]*\r\n)*)\r\n"
)
#: One header line: its name, and its value without the whitespace around it.  The
#: value is words separated by runs of spaces and tabs, so it cannot end in one (a
#: lazy ``(.*?)`` before the trailing whitespace cost twice the time, trying the
#: rest of the line at every character).
_HEADER_LINE = re.compile(rb"([^:]+):[ \t]*([^ \t\r]*(?:[ \t]+[^ \t\r]+)*)[ \t]*\r\n")
#: Headers that make a request not simple (httptools and uvicorn handle them).
_NOT_SIMPLE = frozenset((b"transfer-encoding", b"expect", b"upgrade"))
#: Bytes of pipelined requests held before the connection stops reading.
_HELD_MAX = 65536


def simple_request(
    data: bytes, max_body: int
) -> tuple[list[tuple[bytes, bytes]], bytes, bool, int] | None:
    """A simple ``POST /`` at the start of ``data``: its headers (lower-case names),
    its body, whether the connection stays open after it, and where it ends; or None
    (httptools parses it, and the rest of its connection)."""
    head = _SIMPLE_HEAD.match(data)
    if head is None:
        return None
    headers = [(name.lower(), value) for name, value in _HEADER_LINE.findall(head.group(1))]
    length = 0
    lengths = 0
    keep_alive = True
    for name, value in headers:
        if name == b"content-length":
            if not value.isdigit():
                return None
            length = int(value)
            lengths += 1
        elif name == b"connection":
            tokens = {t.strip() for t in value.lower().split(b",")}
            if b"upgrade" in tokens:
                return None
            if b"close" in tokens:
                keep_alive = False
        elif name in _NOT_SIMPLE:
            return None
    if lengths > 1 or length > max_body:
        return None
    start = head.end()
    end = start + length
    if len(data) < end:
        return None  # the body is still on its way: httptools reads it, with its deadline
    return headers, data[start:end], keep_alive, end


def response(
    status: int,
    defaults: list[tuple[bytes, bytes]],
    headers: Sequence[tuple[bytes, bytes]],
    keep_alive: bool,
    body: bytes,
) -> bytes:
    """One whole response: status line, uvicorn's default headers, ``headers``, and
    ``Connection: close`` where the connection ends after it."""
    parts = [STATUS_LINES[status]]
    for name, value in defaults:
        parts += (name, b": ", value, b"\r\n")
    for name, value in headers:
        parts += (name, b": ", value, b"\r\n")
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts += (b"\r\n", body)
    return b"".join(parts)


class JsonHeads:
    """The head of a kept-alive JSON answer up to its ``Content-Length`` value, by
    status, made once for the default headers of the moment (uvicorn makes a new
    list when its ``Date`` changes, once a second): an answer is then this, its
    length and its body, not a list of header lines joined per answer."""

    __slots__ = ("defaults", "heads")

    def __init__(self) -> None:
        self.defaults: list[tuple[bytes, bytes]] | None = None
        self.heads: dict[int, bytes] = {}

    def answer(self, status: int, defaults: list[tuple[bytes, bytes]], body: bytes) -> bytes:
        if defaults is not self.defaults:
            self.defaults, self.heads = defaults, {}
        head = self.heads.get(status)
        if head is None:
            whole = response(status, defaults, json_headers(b"", status), True, b"")
            head = self.heads[status] = whole[: -len(b"0\r\n\r\n")]
        return b"%s%d\r\n\r\n%s" % (head, len(body), body)


class _Cycle(Protocol):
    """What :class:`DirectSend` uses of uvicorn's ``RequestResponseCycle``."""

    transport: asyncio.Transport
    flow: Any
    default_headers: list[tuple[bytes, bytes]]
    keep_alive: bool
    disconnected: bool
    response_started: bool
    response_complete: bool
    waiting_for_100_continue: bool
    message_event: Any
    on_response: Any


class DirectSend:
    """An ASGI ``send`` for one response of one head and one body (what
    ``App.protocol`` sends), written in one ``transport.write``."""

    __slots__ = ("cycle", "headers", "started", "status")

    def __init__(self, cycle: _Cycle) -> None:
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
        await self.write(message.get("body", b""))

    async def write(self, body: bytes) -> None:
        """The head (status, uvicorn's default headers, ours) and ``body`` in one write,
        once the peer has read enough of what was written before."""
        cycle = self.cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        self.now(body)

    def now(self, body: bytes) -> None:
        """:meth:`write` without waiting for the write buffer to drain."""
        cycle = self.cycle
        if cycle.disconnected:
            return
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        cycle.transport.write(
            response(self.status, cycle.default_headers, self.headers, cycle.keep_alive, body)
        )
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


async def answer_directly(app: App, cycle: _Cycle) -> None:
    """One ``POST /`` that uvicorn parsed, through ``App.protocol`` with a
    :class:`DirectSend`."""
    send = DirectSend(cycle)
    try:
        scope, receive = cycle.scope, cycle.receive  # type: ignore[attr-defined]
        await app.protocol(scope, receive, send)
    except BaseException as exc:
        failed(cycle, send, exc)
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
            raise


#: The answer to a ``POST /`` whose serving raised outside the envelope handler (a
#: bug), as uvicorn gives it: a plain 500, and the connection closed after it.
BROKEN_BODY = b"Internal Server Error"
BROKEN_HEADERS = (
    (b"content-type", b"text/plain; charset=utf-8"),
    (b"content-length", b"%d" % len(BROKEN_BODY)),
)


def failed(cycle: _Cycle, send: DirectSend, exc: BaseException) -> None:
    """``Envelopes.envelope`` answers every request itself; reaching here is a bug.  Answer as
    uvicorn would (500, close)."""
    log.error("POST / failed outside the envelope path", exc_info=exc)
    if not send.started and not cycle.disconnected and not cycle.transport.is_closing():
        cycle.keep_alive = False
        send.status, send.headers = 500, list(BROKEN_HEADERS)
        send.now(BROKEN_BODY)
    elif not cycle.response_complete:
        cycle.transport.close()


class DirectHttpToolsProtocol(GuardedHttpToolsProtocol):
    """The guarded httptools protocol that answers ``POST /`` directly."""

    troth: ClassVar[App | None] = None
    #: ``{"direct": requests answered directly, "simple": of them, read by
    #: simple_request}`` (tests check that the paths are taken).  A dict, not a
    #: class attribute bumped per request: assigning to a class attribute
    #: invalidates the interpreter's attribute cache of the class,
    #: and every later lookup on every connection would miss it.
    counts: ClassVar[dict[str, int]]
    #: The heads of simple requests' answers (:meth:`reply`), shared by every
    #: connection of the server.
    json_heads: ClassVar[JsonHeads]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        troth = type(self).troth
        #: Whether this connection's requests are still read by :func:`simple_request`.
        self.simple = troth is not None and troth.cors is None and self.limit_concurrency is None
        self.max_body = 0 if troth is None else troth.settings.max_body
        #: Whether a simple request is being answered (its batch, or a peer that does
        #: not read, keeps it waiting), whether its connection stays open after it, and
        #: bytes that came after it.
        self.answering = False
        self.keep_alive = True
        self.held = b""
        #: The task that writes a simple answer once the peer has read what was
        #: written before (held: the event loop keeps only a weak reference to it).
        self.draining: asyncio.Future[None] | None = None
        #: Whether :meth:`take` is on the stack (an answer written at once).
        self.taking = False
        #: When the simple request being answered was read whole.
        self.started = 0.0

    # -- simple requests -------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if not self.simple:
            super().data_received(data)
            return
        self._unset_keepalive_if_required()
        if self.answering:  # pipelined: it waits for the answer before it
            self.held += data
            if len(self.held) > _HELD_MAX:
                self.flow.pause_reading()
            return
        if self.held:
            data, self.held = self.held + data, b""
        self.take(data)

    def take(self, data: bytes) -> None:
        """Answer the simple requests at the start of ``data``, or hand the connection
        to httptools from the first that is not simple on."""
        troth = type(self).troth
        assert troth is not None  # self.simple is False without it
        self.taking = True
        try:
            while True:
                request = simple_request(data, self.max_body)
                if request is None:
                    self.simple = False
                    super().data_received(data)
                    return
                headers, body, keep_alive, end = request
                self.held = data[end:]
                self._phase = IDLE  # the request is read whole: no header or body deadline
                self.counts["direct"] += 1
                self.counts["simple"] += 1
                self.started = time.perf_counter()
                self.keep_alive = keep_alive
                try:
                    answer = troth.envelopes.answer_soon(body, headers, self.reply)
                except Exception as exc:  # a bug before the engine: 500, as a task had
                    self.broke(exc)
                else:
                    if answer is None:  # its batch answers (reply, called back)
                        self.answering = True
                    else:
                        self.reply(answer)
                # Answered at once (a point read, a refusal): the next pipelined request
                # is read here, not by simple_answered (no recursion per request).
                if self.answering or not self.held or self.transport.is_closing():
                    return
                data, self.held = self.held, b""
                self._unset_keepalive_if_required()
        finally:
            self.taking = False

    def reply(self, answer: Answer) -> None:
        """The one writer of a simple request's answer: called at once by :meth:`take`
        (a point read, a refusal) or back by ``Envelopes.answer_soon`` when the
        request's batch committed.  One ``transport.write`` of the head (made once per
        status, :class:`JsonHeads`) and the body, the answer counted and logged, then
        the next pipelined request.  A peer that does not read gets it once the write
        buffer drains; an answer that does not encode gets a 500 (:meth:`broke`)."""
        kind, corr, status, data, _ = answer
        try:
            body = encode_response(kind, corr, status, data)
        except Exception as exc:
            self.broke(exc)
            return
        transport = self.transport
        if not transport.is_closing():  # else the peer went: nothing to write to
            if self.flow.write_paused:
                self.answering = True
                self.draining = asyncio.ensure_future(self._drained(answer))
                return
            defaults = self.server_state.default_headers
            if self.keep_alive:
                transport.write(self.json_heads.answer(status, defaults, body))
            else:
                transport.write(response(status, defaults, json_headers(body, status), False, body))
                transport.close()
        try:
            self.troth.answered(answer, self.started)  # type: ignore[union-attr]
        except Exception:  # written already: logged and left
            log.exception("counting an answer failed")
        self.simple_answered()

    async def _drained(self, answer: Answer) -> None:
        """:meth:`reply` again once the peer has read enough of what was written."""
        try:
            await self.flow.drain()
        finally:
            self.draining = None
        self.reply(answer)

    def broke(self, exc: Exception) -> None:
        """Serving a simple request raised where ``Envelopes.answer_soon`` answers every
        error itself: a bug.  Answered as uvicorn would (500, close)."""
        log.error("POST / failed outside the envelope path", exc_info=exc)
        if not self.transport.is_closing():
            defaults = self.server_state.default_headers
            self.transport.write(response(500, defaults, BROKEN_HEADERS, False, BROKEN_BODY))
            self.transport.close()
        self.simple_answered()

    def simple_answered(self) -> None:
        """The answer is written: as uvicorn after a response, then the next
        pipelined request, if one came."""
        self.answering = False
        self._kept()
        if self.taking:
            return  # take goes on with what is held
        if self.held and not self.transport.is_closing():
            data, self.held = self.held, b""
            self._unset_keepalive_if_required()
            self.take(data)

    def _kept(self) -> None:
        """uvicorn's ``on_response_complete`` for a simple request, whose connection has
        no uvicorn pipeline: the keep-alive wait is noted for the sweeper
        (``server/http/timeouts.py``), which closes the connection past ``idle_timeout``,
        instead of a timer armed and cancelled per response (1.8 µs of the event loop
        a request, measured alone)."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        self._phase = KEPT
        self._since = self.loop.time()

    def shutdown(self) -> None:
        if self.answering:  # close once its answer is written
            self.keep_alive = False
            return
        super().shutdown()

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
    header_timeout: float, body_timeout: float, app: App | None, idle_timeout: float = 5.0
) -> type[DirectHttpToolsProtocol]:
    """The protocol class of one server: its own connection set and sweeper
    (``server/http/timeouts.py``), and ``POST /`` answered directly by ``app`` (None: every
    request takes ASGI)."""
    return type(
        "DirectHttpToolsProtocol",
        (DirectHttpToolsProtocol,),
        {
            "header_timeout": header_timeout,
            "body_timeout": body_timeout,
            "idle_timeout": idle_timeout,
            "live": set(),
            "sweeping": None,
            "cut": 0,
            "troth": app,
            "counts": {"direct": 0, "simple": 0},
            "json_heads": JsonHeads(),
        },
    )
