"""A lean HTTP/1.1 client for the load generator: keep-alive POSTs and SSE streams.

Why not httpx: on this 2-core machine the server takes one core for its event loop
and the writer thread takes what the GIL and fsync leave, so the generator has about
one core, and httpx spends several times more CPU per request than the server under
test.  This client is an ``asyncio.Protocol`` over one socket with ``httptools``
(the C parser uvicorn itself uses, already a dependency) doing the response parsing,
chunked decoding included; it costs a few tens of microseconds per request.  The
bench reports the generator's CPU next to every figure so that a saturated generator
cannot pass for a slow server.

One connection carries one request at a time (no pipelining), as a real SDK's pooled
connection does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

import httptools


class HttpError(Exception):
    """The connection broke or answered something that is not HTTP."""


def split_url(url: str) -> tuple[str, int]:
    """``(host, port)`` of an ``http://`` URL (the bench speaks plain HTTP only)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"the bench needs an http://host:port URL, not {url!r}")
    return parts.hostname, parts.port or 80


class _Parsing(asyncio.Protocol):
    """Feeds what arrives to an ``httptools`` parser; a parse error ends the connection.

    The read instant is taken before parsing (what the bench reports is the moment
    the bytes reached the generator's process)."""

    #: What a parse error calls the response ("HTTP", "SSE").
    what = "HTTP"
    parser: httptools.HttpResponseParser
    transport: asyncio.Transport | None
    read_at: float

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.read_at = time.perf_counter()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._broken(HttpError(f"bad {self.what} response: {exc}"))
            if self.transport is not None:
                self.transport.close()

    def _broken(self, exc: BaseException) -> None:
        raise NotImplementedError


class HttpConnection(_Parsing):
    """One keep-alive connection; :meth:`post` sends a body and returns the answer."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.chunks: list[bytes] = []
        self.lost: BaseException | None = None
        self.read_at = 0.0  # perf_counter() when the latest bytes arrived
        self.sent_at = 0.0  # perf_counter() when the latest request was written
        self._prefix = (
            f"POST / HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\nContent-Length: "
        ).encode()

    @classmethod
    async def open(cls, host: str, port: int) -> HttpConnection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: cls(host, port), host, port)
        return conn

    # -- asyncio.Protocol --------------------------------------------------------------

    def _broken(self, exc: BaseException) -> None:
        self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or HttpError("connection closed by the server")
        self._fail(self.lost)

    # -- httptools callbacks -------------------------------------------------------------

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.chunks)
        self.chunks = []
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self.parser.get_status_code(), body))

    # -- requests -------------------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    async def post(self, body: bytes, path: str = "/") -> tuple[int, bytes]:
        """``POST /`` (or ``path``: the operator API) with a JSON body; returns
        ``(HTTP status, response body)``."""
        if self.lost is not None or self.transport is None:
            raise HttpError(f"connection to {self.host}:{self.port} is closed: {self.lost}")
        if self.waiter is not None:
            raise RuntimeError("one request at a time per connection")
        waiter: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self.waiter = waiter
        prefix = self._prefix
        if path != "/":
            prefix = prefix.replace(b"POST / ", f"POST {path} ".encode(), 1)
        self.sent_at = time.perf_counter()
        self.transport.write(prefix + str(len(body)).encode() + b"\r\n\r\n" + body)
        return await waiter

    async def get(self, path: str) -> tuple[int, bytes]:
        """A plain ``GET`` (``/ready``, ``/metrics``)."""
        if self.lost is not None or self.transport is None:
            raise HttpError(f"connection to {self.host}:{self.port} is closed: {self.lost}")
        waiter: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self.waiter = waiter
        self.transport.write(
            f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n\r\n".encode()
        )
        return await waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


#: Called with one ``data:`` payload and the ``time.perf_counter()`` it was read at.
OnMessage = Callable[[bytes, float], None]


class SseConnection(_Parsing):
    """A worker's ``GET /poll/{group}/{id}``: every ``data:`` line goes to ``on_message``.

    The read instant is taken in ``data_received``, before parsing, so the dispatch
    latency the bench reports is the moment the bytes reached the worker's process.
    """

    what = "SSE"

    def __init__(self, host: str, port: int, path: str, on_message: OnMessage) -> None:
        self.host = host
        self.port = port
        self.path = path
        self.on_message = on_message
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.buffer = b""
        self.read_at = 0.0
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.messages = 0

    @classmethod
    async def open(cls, host: str, port: int, path: str, on_message: OnMessage) -> SseConnection:
        """Connect and wait for the server's first comment: from then on the connection
        is in the server's registry and can be sent to."""
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            lambda: cls(host, port, path, on_message), host, port
        )
        await asyncio.wait_for(conn.ready, 10)
        return conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        self.transport.write(
            f"GET {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )

    def _broken(self, exc: BaseException) -> None:
        self._done(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._done(exc or HttpError("SSE stream closed"))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status != 200 and not self.ready.done():
            self.ready.set_exception(HttpError(f"GET {self.path} answered {status}"))

    def on_body(self, body: bytes) -> None:
        if not self.ready.done():
            self.ready.set_result(None)
        self.buffer += body
        while True:
            end = self.buffer.find(b"\n\n")
            if end < 0:
                return
            event, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    self.messages += 1
                    self.on_message(line[5:].lstrip(b" "), self.read_at)

    def _done(self, exc: BaseException) -> None:
        if not self.ready.done():
            self.ready.set_exception(exc)
        if not self.closed.done():
            self.closed.set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
