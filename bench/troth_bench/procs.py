"""Servers the bench starts: ``troth serve`` and the bare ASGI endpoint, as subprocesses.

A subprocess, not a thread: the server must own its GIL and its cores exactly as in
production, and its CPU and RSS must be readable apart from the generator's.  It runs
in its own empty working directory with every ``TROTH_*`` variable removed, so no
stray ``troth.toml`` or environment setting changes what the table says was in force.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from troth_bench.http import HttpConnection


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TROTH_")}


def child_pids(pid: int) -> list[int]:
    """The child processes of ``pid``, sorted (Linux: /proc/PID/task/PID/children);
    none when it is gone."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return sorted(int(c) for c in text.split())


class ServerProcess:
    """A server subprocess on a free local port, with its log in ``workdir``."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        workdir: Path,
        port: int,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.env = env or {}
        self.workdir = workdir
        self.port = port
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def troth(
        cls,
        workdir: Path,
        db: Path,
        *,
        synchronous: str,
        store: str = "sqlite",
        extra: list[str] | None = None,
        postgres_url: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ServerProcess:
        """``troth serve`` on SQLite file ``db``, or (``postgres_url``) on PostgreSQL;
        ``env``: more environment variables (the tracing exporter's)."""
        port = free_port()
        where = (
            ["--store", "postgres", "--postgres-url", postgres_url]
            if postgres_url is not None
            else ["--store", store, "--db", str(db), "--synchronous", synchronous]
        )
        argv = [
            sys.executable,
            "-m",
            "troth.cli.main",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *where,
            # The access log is an INFO line per request on logger troth.access: at
            # warning it is filtered before any formatting.
            "--log-level",
            "warning",
            *(extra or []),
        ]
        return cls("troth", argv, workdir, port, env)

    @classmethod
    def bare(cls, workdir: Path) -> ServerProcess:
        port = free_port()
        return cls("bare", [sys.executable, "-m", "troth_bench.bare", str(port)], workdir, port)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def serving_pids(self) -> list[int]:
        """The processes that serve: this one, or a ``--workers`` supervisor's
        children (whose CPU and memory are the server's; the supervisor only waits)."""
        if "--workers" not in self.argv:
            return [self.pid]
        wanted = int(self.argv[self.argv.index("--workers") + 1])
        deadline = time.monotonic() + 30
        while True:
            children = child_pids(self.pid)
            if len(children) >= wanted or time.monotonic() > deadline:
                return children or [self.pid]
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, timeout: float = 30.0) -> None:
        """Spawn and wait until it answers (``/ready`` for troth, a POST for bare)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.workdir,
                env={**clean_env(), **self.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} server exited at start: {self.tail()}")
            try:
                conn = await HttpConnection.open("127.0.0.1", self.port)
                try:
                    if self.name == "troth":
                        status, _ = await asyncio.wait_for(conn.get("/ready"), 5)
                    else:
                        status, _ = await asyncio.wait_for(conn.post(b"{}"), 5)
                finally:
                    conn.close()
                if status == 200:
                    return
            except (OSError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{self.name} server did not become ready: {self.tail()}")
            await asyncio.sleep(0.05)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (graceful: the writer commits what was queued), then wait.

        Returns 0 for a clean exit: uvicorn re-raises the SIGTERM it handled once it
        has shut down, so ``-SIGTERM`` after our own signal is clean too."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return -signal.SIGKILL
        code = self.proc.returncode or 0
        return 0 if code == -signal.SIGTERM else code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
