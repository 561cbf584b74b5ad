"""Slow clients: a request's headers and body must arrive in time.

uvicorn (httptools) closes a keep-alive connection idle between requests
(``timeout_keep_alive``, troth's ``idle_timeout``), but it has no timer for a
connection that opens and sends nothing, for headers that trickle in, or for a body
that trickles in: each of those holds a socket (and, for a body, an ASGI task) for
as long as the client likes.  :class:`GuardedHttpToolsProtocol` is a subclass of uvicorn's
httptools protocol that notes, with one clock reading, when a connection starts
waiting for headers (it opened, or a new request began) and when its headers ended,
and one sweeper per server, running only while connections are open, cuts off
every connection past ``header_timeout`` or ``body_timeout``: it answers ``408``
(a protocol envelope, ``kind`` ``unknown``) unless a response already started,
then closes.  The request path pays two ``loop.time()`` calls and no timer.

The same sweeper closes a connection whose simple ``POST /`` was answered
(``server/http/direct.py``) once it has waited longer than ``idle_timeout`` for the next
request — what uvicorn's keep-alive timer does for every other response, without a
timer armed and cancelled per request.  It closes within a sweep interval (at most
a quarter of ``idle_timeout``, and 1 s) after the deadline, never before.

Not covered here: a client that reads its *response* slowly (a response is small;
an SSE stream is paced by transport flow control and the keep-alive comments) and
the TLS handshake with ``tls_cert`` (the event loop bounds it at 60 s).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from troth.protocol.envelope import encode_response
from troth.server.logs import Throttled

#: One line a second at most, however many connections a slowloris opens.
warnings = Throttled(logging.getLogger("troth.server"))

#: IDLE: a request is being answered, or nothing is timed.  KEPT: a simple request's
#: answer was written and the connection waits for the next one (closed past
#: ``idle_timeout``; direct.py).
IDLE, HEADERS, BODY, KEPT = 0, 1, 2, 3


def timeout_response(message: str) -> bytes:
    body = encode_response("unknown", "0", 408, message)
    head = (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    )
    return head + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header and body read deadlines."""

    header_timeout: ClassVar[float] = 10.0
    body_timeout: ClassVar[float] = 30.0
    #: The keep-alive uvicorn was given (``timeout_keep_alive``): how often to sweep.
    idle_timeout: ClassVar[float] = 5.0
    live: ClassVar[set[GuardedHttpToolsProtocol]]
    sweeping: ClassVar[asyncio.TimerHandle | None]
    cut: ClassVar[int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = IDLE
        self._since = 0.0

    # -- the phases ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._phase = HEADERS
        self._since = self.loop.time()
        cls = type(self)
        cls.live.add(self)
        if cls.sweeping is None:
            cls.sweeping = self.loop.call_later(cls.interval(), cls.sweep, self.loop)

    def connection_lost(self, exc: Exception | None) -> None:
        self._phase = IDLE
        type(self).live.discard(self)
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._phase in (IDLE, KEPT):  # a new request on a kept-alive connection
            self._phase = HEADERS
            self._since = self.loop.time()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._phase = BODY
        self._since = self.loop.time()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._phase = IDLE

    # -- the sweeper -----------------------------------------------------------------

    @classmethod
    def interval(cls) -> float:
        return min(1.0, cls.header_timeout / 4, cls.body_timeout / 4, cls.idle_timeout / 4)

    @classmethod
    def sweep(cls, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for conn in list(cls.live):
            if conn._phase == HEADERS and now - conn._since > cls.header_timeout:
                conn.expire("headers", cls.header_timeout)
            elif conn._phase == BODY and now - conn._since > cls.body_timeout:
                conn.expire("body", cls.body_timeout)
            elif conn._phase == KEPT and now - conn._since > conn.timeout_keep_alive:
                conn._phase = IDLE
                if not conn.transport.is_closing():
                    conn.transport.close()  # as uvicorn's keep-alive timer would
        cls.sweeping = loop.call_later(cls.interval(), cls.sweep, loop) if cls.live else None

    def expire(self, what: str, limit: float) -> None:
        type(self).live.discard(self)
        type(self).cut += 1
        self._phase = IDLE
        peer = f"{self.client[0]}:{self.client[1]}" if self.client else "?"
        warnings.warning(
            "slow", "slow client %s: request %s not received within %g s; closed", peer, what, limit
        )
        transport = self.transport
        if transport.is_closing():
            return
        cycle = self.cycle
        if what == "headers":  # the cycle, if any, is the previous request's
            answer = cycle is None or cycle.response_complete
        else:
            answer = not cycle.response_started
        if answer:
            transport.write(timeout_response(f"Request {what} not received within {limit:g} s"))
        transport.close()
