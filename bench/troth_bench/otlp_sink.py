"""An OTLP/HTTP trace endpoint that takes spans and drops them: where the servers of
``troth bench --tracing`` export to, so that the figures count what tracing costs a
server (making, batching, encoding and sending its spans), not a collector's work.

Run as ``python -m troth_bench.otlp_sink PORT``; ``GET /stats`` answers how many
exports and bytes it took, which the bench prints (a run whose servers exported
nothing did not measure tracing at all).
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from troth_bench.procs import clean_env, free_port


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # the exporter keeps its connection
    exports = 0
    bytes = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        size = int(self.headers.get("content-length") or 0)
        self.rfile.read(size)
        with _Handler.lock:
            _Handler.exports += 1
            _Handler.bytes += size
        # An empty ExportTraceServiceResponse is zero bytes of protobuf.
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        body = json.dumps({"exports": _Handler.exports, "bytes": _Handler.bytes}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class SinkProcess:
    """The sink as a process of its own (its work is not the generator's)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        argv = [sys.executable, "-m", "troth_bench.otlp_sink", str(self.port)]
        self.proc = subprocess.Popen(argv, cwd=self.workdir, env=clean_env())
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.stats()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the OTLP sink did not start") from None
                time.sleep(0.05)

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(f"{self.url}/stats", timeout=2) as r:
            got: dict[str, int] = json.loads(r.read())
            return got

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def main() -> None:
    port = int(sys.argv[1])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
