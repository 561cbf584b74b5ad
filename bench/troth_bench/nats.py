"""The bench over NATS: its own ``nats-server``, protocol calls through troth's request
queue group, and workers that receive their ``execute`` on ``nats://`` subjects.

The NATS workloads (``create-settle-nats``, ``lifecycle-nats``) are the HTTP ones with
the transport swapped, so that their figures sit beside the HTTP figures of the same
run: the requests go as the SDKs' NATS connector (``resonate-nats``) sends them — the
envelope published to ``{prefix}.requests.{base64url(origin)}`` with a
``Resonate-Reply-To`` header — and the answer is read from that inbox.  One NATS
connection carries every client's requests (one SDK process holds one connection);
the replies come back on one wildcard inbox subscription and are matched by token,
where the connector subscribes an inbox per request (client-side work troth does not
see).  The lifecycle's workers queue-subscribe the anycast subject of their group, as
the connector's workers do, on a connection of their own.

Without ``nats-server`` (on PATH or in /usr/sbin) the NATS workloads are skipped with
a message saying how to get it; the HTTP workloads of the run are unaffected.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec
import nats
from nats.aio.client import Client as NatsConnection
from nats.aio.msg import Msg

from troth_bench.client import BenchFailure, Client, checked_reply, request_body
from troth_bench.options import NATS_WORKLOADS
from troth_bench.procs import free_port

__all__ = ["NATS_WORKLOADS", "NatsClient", "NatsRequests", "NatsServerProcess", "find_binary"]

#: troth's default ``nats_prefix`` (request subjects ``{prefix}.requests.…``).
PREFIX = "resonate"
#: The connector's subscription prefix for execute/unblock.
RECV = "resonate.recv"
REPLY_HEADER = "Resonate-Reply-To"
HOW_TO_GET = (
    "nats-server not found (on PATH or /usr/sbin): `apt-get install nats-server` or a "
    "release from the NATS project on PATH"
)

_corr = itertools.count(1)


def find_binary() -> str | None:
    found = shutil.which("nats-server")
    if found:
        return found
    return "/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else None


class NatsServerProcess:
    """A ``nats-server`` on a free local port for one run (core NATS, no JetStream)."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.port = free_port()
        self.log_path = workdir / "nats-server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "-a", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited: {self.log_path.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    if s.recv(4).startswith(b"INFO"):
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nats-server did not start on port {self.port}")

    def version(self) -> str:
        try:
            out = subprocess.run(
                [self.binary, "--version"], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return "?"
        return out.stdout.strip() or "?"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def request_subject(origin: str, prefix: str = PREFIX) -> str:
    """Where the connector publishes a request of ``origin``."""
    token = base64.urlsafe_b64encode(origin.encode()).rstrip(b"=").decode()
    return f"{prefix}.requests.{token}"


class NatsRequests:
    """One NATS connection carrying the requests of many clients, with one wildcard
    inbox subscription on which every answer arrives (matched by its last token)."""

    def __init__(self, nc: NatsConnection) -> None:
        self.nc = nc
        self.inbox = nc.new_inbox()
        self.waiting: dict[str, asyncio.Future[tuple[bytes, float]]] = {}
        self._tokens = itertools.count(1)

    @classmethod
    async def connect(cls, url: str) -> NatsRequests:
        nc = await nats.connect(url, name="troth bench", max_reconnect_attempts=0)
        self = cls(nc)
        await nc.subscribe(f"{self.inbox}.*", cb=self._answer)
        await nc.flush()
        return self

    async def _answer(self, msg: Msg) -> None:
        read_at = time.perf_counter()
        fut = self.waiting.pop(msg.subject.rpartition(".")[2], None)
        if fut is not None and not fut.done():
            fut.set_result((msg.data, read_at))

    async def ask(self, subject: str, body: bytes, timeout: float) -> tuple[bytes, float]:
        """Publish ``body`` with its inbox in the header; the answer and when it arrived."""
        token = str(next(self._tokens))
        fut: asyncio.Future[tuple[bytes, float]] = asyncio.get_running_loop().create_future()
        self.waiting[token] = fut
        await self.nc.publish(subject, body, headers={REPLY_HEADER: f"{self.inbox}.{token}"})
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self.waiting.pop(token, None)
            raise BenchFailure(f"no answer over NATS on {subject} within {timeout:.0f} s") from None

    async def ready(self, timeout: float) -> None:
        """Wait until some troth node serves requests (it subscribes once connected)."""
        body = request_body("promise.get", "probe", {"id": "troth-bench-nats-probe"})
        deadline = time.monotonic() + timeout
        while True:
            try:
                await self.ask(request_subject("probe"), body, 1.0)
                return
            except BenchFailure:
                if time.monotonic() > deadline:
                    raise BenchFailure(
                        f"troth did not serve requests over NATS within {timeout:.0f} s"
                    ) from None

    async def close(self) -> None:
        try:
            await self.nc.close()
        except Exception:  # closing after a failure: nothing left to save
            pass


class NatsClient(Client):
    """A :class:`Client` whose calls go over NATS (the checks are the same: kind,
    corrId; a NATS answer has no HTTP status, its ``head.status`` is the status).

    It shares the connection of :class:`NatsRequests`; it holds no HTTP connection,
    so only :meth:`call`, :meth:`ok` and :attr:`read_at` are meant for it."""

    def __init__(self, requests: NatsRequests, name: str, timeout: float) -> None:
        self.requests = requests
        self.name = name
        self.reconnects = 0
        self.subject = request_subject(name)
        self.timeout = timeout
        self._read_at = 0.0

    @property
    def read_at(self) -> float:
        return self._read_at

    async def call(self, kind: str, data: Any) -> tuple[int, Any, float]:
        corr = f"{self.name}-{next(_corr)}"
        body = request_body(kind, corr, data)
        sent_at = time.perf_counter()
        raw, self._read_at = await self.requests.ask(self.subject, body, self.timeout)
        reply = checked_reply(kind, corr, raw)
        return reply.head.status, msgspec.json.decode(reply.data), self._read_at - sent_at

    def close(self) -> None:
        pass  # the connection is the NatsRequests'
