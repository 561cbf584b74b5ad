"""A strict SSE reader for tests (``GET /poll/{group}/{id}``).

As strict as the Python SDK's parser: events are separated by a blank line with LF
only, every ``data:`` line is one JSON message.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from helpers.support import RunningServer


@dataclass
class Stream:
    """A background SSE reader collecting raw bytes and decoded messages."""

    url: str
    raw: bytearray = field(default_factory=bytearray)
    messages: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    connected: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    client: httpx.Client | None = None
    #: The open stream's socket, shut down by :meth:`close` to wake the reader at once
    #: (closing the client does not interrupt a read already waiting on it: the
    #: reader would wake only at the server's next keep-alive).
    sock: socket.socket | None = None

    def run(self) -> None:
        try:
            self._run()
        except (httpx.HTTPError, RuntimeError, OSError):
            if not self.stop.is_set():
                raise

    def close(self) -> None:
        self.stop.set()
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
        if self.client is not None:
            self.client.close()

    def _run(self) -> None:
        self.client = httpx.Client(timeout=None)
        with self.client.stream("GET", self.url, headers={"accept": "text/event-stream"}) as r:
            assert r.headers["content-type"] == "text/event-stream"
            stream = r.extensions.get("network_stream")
            self.sock = stream.get_extra_info("socket") if stream is not None else None
            buffer = b""
            for chunk in r.iter_raw():
                self.raw.extend(chunk)
                buffer += chunk
                self.connected.set()
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    for line in event.split(b"\n"):
                        if line.startswith(b"data: "):
                            self.messages.put(json.loads(line[6:]))
                if self.stop.is_set():
                    return

    def next(self, timeout: float = 5.0) -> dict[str, Any]:
        return self.messages.get(timeout=timeout)


@contextmanager
def stream(server: RunningServer | str, group: str, id: str) -> Iterator[Stream]:
    base = server if isinstance(server, str) else server.url
    s = Stream(f"{base}/poll/{group}/{id}")
    t = threading.Thread(target=s.run, daemon=True)
    t.start()
    assert s.connected.wait(5), "SSE stream did not open"
    # Registration happens before the first byte is sent, so the stream is live.
    try:
        yield s
    finally:
        s.close()
        t.join(5)
