"""A local HTTP endpoint for the push tests: records every POST (headers, JSON body)
and answers ``status[0]``, after ``delay`` seconds."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from helpers.support import free_port


@dataclass
class Hook:
    port: int
    seen: list[tuple[dict[str, str], dict[str, Any]]]
    status: list[int]


@contextmanager
def hook_server(delay: float = 0.0) -> Iterator[Hook]:
    seen: list[tuple[dict[str, str], dict[str, Any]]] = []
    status = [200]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["content-length"])
            body = json.loads(self.rfile.read(length))
            seen.append(({k.lower(): v for k, v in self.headers.items()}, body))
            time.sleep(delay)
            self.send_response(status[0])
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    port = free_port()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield Hook(port, seen, status)
    finally:
        httpd.shutdown()
        httpd.server_close()
