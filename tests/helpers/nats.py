"""A throwaway NATS server for the NATS tests, in the spirit of ``helpers/pg.py``.

Each test module (or test) that needs NATS starts its own ``nats-server`` on a free
port (plain core NATS: troth uses no JetStream), waits until it accepts connections
and stops it afterwards, so tests never share subjects with each other or with a
NATS the machine runs for something else.

Without the binary the tests are *skipped*, saying how to get it: NATS is an optional
integration, unlike PostgreSQL (a backend every test runs on).  ``TROTH_NATS_SERVER``
names the binary; else ``nats-server`` on PATH, else ``/usr/sbin/nats-server``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers.support import free_port

HOW_TO_GET = (
    "the NATS tests need nats-server: `apt-get install nats-server` (Debian/Ubuntu), "
    "or a release from the NATS project on PATH, or set TROTH_NATS_SERVER=/path/to/nats-server"
)


def binary() -> str | None:
    override = os.environ.get("TROTH_NATS_SERVER")
    if override:
        return override if Path(override).exists() else None
    found = shutil.which("nats-server")
    if found:
        return found
    return "/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else None


def require_binary() -> str:
    """The nats-server binary, or skip the test saying how to get one."""
    found = binary()
    if found is None:
        pytest.skip(HOW_TO_GET)
    return found


@dataclass
class NatsServer:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def restart(self) -> None:
        """Start it again on the same port (after :meth:`stop`)."""
        self.process = _spawn(require_binary(), self.port, self.log)
        _wait_ready(self.port, self.process, self.log)


def _spawn(
    exe: str, port: int, log: Path, max_payload: int | None = None
) -> subprocess.Popen[bytes]:
    argv = [exe, "-a", "127.0.0.1", "-p", str(port)]
    if max_payload is not None:
        # No flag for it: a config file of one line.
        conf = log.with_suffix(".conf")
        conf.write_text(f"max_payload: {max_payload}\n")
        argv += ["-c", str(conf)]
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def _wait_ready(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"nats-server exited ({process.returncode}): {log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                if s.recv(4).startswith(b"INFO"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nats-server did not start on port {port}: {log.read_text()}")


@contextmanager
def nats_server(max_payload: int | None = None) -> Iterator[NatsServer]:
    """A fresh nats-server on a free port for the ``with`` block (skips without one)."""
    exe = require_binary()
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="troth-nats-")) / "nats-server.log"
    process = _spawn(exe, port, log, max_payload)
    server = NatsServer(f"nats://127.0.0.1:{port}", port, process, log)
    try:
        _wait_ready(port, process, log)
        yield server
    finally:
        server.stop()


async def subscribed(nc: Any, subject: str, queue: str = "") -> Any:
    """``nc.subscribe(subject)``, returned once the NATS server has the subscription.

    nats-py's ``flush()`` writes its PING straight to the socket while the SUB still
    waits in nats-py's buffer for its flusher task, so the PONG of one flush can
    come back before the server has read the SUB (and a message published from
    another connection meanwhile meets "no responders").  By the time that PONG is
    back the flusher has written the SUB, so a second PING follows it on the wire.
    """
    sub = await nc.subscribe(subject, queue=queue)
    await nc.flush()
    await nc.flush()
    return sub


def run(coro: Any) -> Any:
    """Run one coroutine on a fresh event loop (tests are synchronous)."""
    return asyncio.run(coro)
