"""A small TCP load balancer for the multi-node tests.

It stands in for what users put in front of N troth nodes: each incoming connection
is forwarded to the next backend in round robin, a backend that refuses the
connection is skipped (it is down), and bytes are piped both ways until either side
closes, when both are closed.  There is no health check and no stickiness: a worker's
SSE stream and its request connections may land on different nodes, and when a node
dies its connections are simply cut, as a real layer-4 balancer does.

It runs an asyncio loop in a daemon thread of the test process.  Every connection is
recorded as a :class:`Route` (backend, first request line, open/closed), so a test can
tell which node holds which worker's ``GET /poll/...`` stream, and that a stream cut
by a crash was opened again on a live node.

    with LoadBalancer([8101, 8102, 8103]) as lb:
        ... lb.url ...
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

#: Bytes of the client's first chunk searched for the request line.
SNIFF = 4096
#: Seconds to wait for a backend to accept before trying the next one.
CONNECT_TIMEOUT = 2.0
CHUNK = 65536


@dataclass
class Route:
    """One client connection and the backend it was forwarded to."""

    serial: int
    backend: int  # the backend's port
    opened_at: float = field(default_factory=time.monotonic)
    #: The first line the client sent (``GET /poll/workers/7f3a HTTP/1.1``), if any.
    first_line: str = ""
    closed_at: float | None = None

    @property
    def open(self) -> bool:
        return self.closed_at is None

    def is_poll(self, group: str | None = None, pid: str | None = None) -> bool:
        """Whether this connection is an SSE stream ``GET /poll/{group}/{pid}``."""
        parts = self.first_line.split(" ")
        if len(parts) < 2 or parts[0] != "GET" or not parts[1].startswith("/poll/"):
            return False
        _, _, g, *rest = parts[1].split("/")
        p = rest[0] if rest else ""
        return (group is None or g == group) and (pid is None or p == pid)


class LoadBalancer:
    """Round-robin TCP proxy on ``host``:(free port) in front of ``backends`` (ports)."""

    def __init__(self, backends: Sequence[int], host: str = "127.0.0.1", port: int = 0) -> None:
        if not backends:
            raise ValueError("a load balancer needs at least one backend")
        self.host = host
        self.backends = list(backends)
        self.routes: list[Route] = []
        self.refused: dict[int, int] = {port: 0 for port in self.backends}
        self.unrouted = 0  # client connections no backend accepted
        self._rr = itertools.count()
        self._serial = itertools.count(1)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))  # a fixed port: a balancer (or database) "restarting"
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"

    # ------------------------------------------------------------------ control
    def start(self) -> LoadBalancer:
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._accept, sock=self._sock, backlog=512)
                )
            except BaseException as exc:  # reported to start()'s caller
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name=f"lb-{self.port}", daemon=True)
        self._thread.start()
        started.wait(10)
        if failure:
            raise RuntimeError(f"load balancer did not start: {failure[0]!r}")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            # Cut every connection; its handler then ends by itself (cancelling a
            # start_server handler makes asyncio log a spurious traceback).
            for writer in list(self._writers):
                writer.transport.abort()
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=5)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> LoadBalancer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ queries
    def snapshot(self) -> list[Route]:
        """A copy of every route so far (the proxy thread keeps appending)."""
        with self._lock:
            return [
                Route(r.serial, r.backend, r.opened_at, r.first_line, r.closed_at)
                for r in self.routes
            ]

    def polls(self, group: str | None = None, *, open_only: bool = True) -> list[Route]:
        """SSE streams (``GET /poll/...``) forwarded so far, the open ones by default."""
        return [r for r in self.snapshot() if r.is_poll(group) and (r.open or not open_only)]

    def describe(self) -> str:
        """Every route, one a line, for a failure message."""
        lines = [f"load balancer {self.url} -> {self.backends}; refused {self.refused}"]
        for r in self.snapshot():
            closed = r.closed_at
            state = "open" if closed is None else f"closed after {closed - r.opened_at:.2f} s"
            lines.append(f"  #{r.serial} -> :{r.backend} {state}: {r.first_line or '(nothing)'}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ proxying
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            await self._forward(reader, writer)
        except Exception:
            pass  # a connection that broke is closed below, as a balancer does
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            writer.transport.abort()

    async def _connect(
        self,
    ) -> tuple[int, asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Open a connection to the next backend that accepts one, in round robin."""
        start = next(self._rr)
        n = len(self.backends)
        for k in range(n):
            port = self.backends[(start + k) % n]
            try:
                r, w = await asyncio.wait_for(
                    asyncio.open_connection(self.host, port), CONNECT_TIMEOUT
                )
            except (TimeoutError, OSError):
                with self._lock:
                    self.refused[port] += 1
                continue
            return port, r, w
        return None

    async def _forward(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        target = await self._connect()
        if target is None:
            with self._lock:
                self.unrouted += 1
            client_w.close()
            return
        port, backend_r, backend_w = target
        self._writers.add(backend_w)
        route = Route(next(self._serial), port)
        with self._lock:
            self.routes.append(route)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, sniff: bool) -> None:
            first = sniff
            while True:
                data = await src.read(CHUNK)
                if not data:
                    return
                if first:
                    first = False
                    line = data[:SNIFF].split(b"\r\n", 1)[0].split(b"\n", 1)[0]
                    route.first_line = line.decode("latin-1", "replace")
                dst.write(data)
                await dst.drain()

        up = asyncio.ensure_future(pipe(client_r, backend_w, True))
        down = asyncio.ensure_future(pipe(backend_r, client_w, False))
        try:
            # Either side closing (or failing) ends the connection on both sides.
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (up, down):
                t.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            for w in (client_w, backend_w):
                with contextlib.suppress(Exception):
                    w.close()
            for w in (client_w, backend_w):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(w.wait_closed(), 1)
            self._writers.discard(backend_w)
            with self._lock:
                route.closed_at = time.monotonic()
