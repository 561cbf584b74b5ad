"""SIGTERM stops ``troth serve`` promptly even with workers' SSE streams open: each
stream ends at the signal instead of holding the stop for uvicorn's whole graceful
wait (10 s, then a cancellation traceback) — longer than a container runtime waits
before SIGKILL (server/stopping.py)."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

from helpers.serve_process import serve


def test_sigterm_ends_open_sse_streams_and_stops_within_seconds(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with serve(["serve", "--db", "t.db"], tmp_path, log) as (proc, url):
        port = int(url.rsplit(":", 1)[1])
        streams = []
        for n in range(3):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /poll/workers/w%d HTTP/1.1\r\nhost: t\r\n\r\n" % n)
            head = b""
            while b": connected" not in head:
                head += s.recv(4096)
            streams.append(s)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) in (0, -signal.SIGTERM), log.read_text()
        took = time.monotonic() - started
        for s in streams:
            rest = b""
            while chunk := s.recv(4096):
                rest += chunk
            assert rest.endswith(b"0\r\n\r\n"), rest  # the stream's last chunk, then EOF
            s.close()
    text = log.read_text()
    assert took < 6, f"stopped after {took:.1f} s"  # 10 s and more before
    assert "Application shutdown complete" in text
    assert "Traceback" not in text and "graceful shutdown exceeded" not in text
