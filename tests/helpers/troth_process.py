"""A ``troth serve`` child process of a test: liveness and protocol calls over HTTP.

Shared by the SDK tests (``test_sdk_e2e.py``: one server killed and restarted in
place; ``test_cluster_sdk.py``: three nodes, one killed for good).  Subclasses say
how to start it.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from helpers.sdk_env import Proc, Procs
from helpers.support import VERSION, free_port

_corr = itertools.count(1)


class TrothProcess:
    """One ``troth serve`` process on a free port; ``down`` once the test killed it."""

    def __init__(self, procs: Procs, name: str) -> None:
        self.procs = procs
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Proc | None = None
        self.down = False
        procs.sentinels.append(self.wedged)

    def wedged(self) -> str | None:
        """Why the process can no longer answer (unless the test killed it); makes
        every wait of the test fail at once."""
        if self.proc is None or self.down:
            return None
        if not self.proc.alive():
            return f"{self.proc.name} exited with {self.proc.popen.returncode}"
        if "Exception in thread" in self.proc.err():
            return f"a thread of {self.proc.name} died, so {self.name} is wedged"
        return None

    def ready(self) -> bool:
        """GET /ready answers 200 (fails the test if the process exited)."""
        if self.proc is not None and not self.proc.alive():
            self.procs.fail(f"{self.name} exited at startup")
        try:
            return httpx.get(f"{self.url}/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL: no shutdown runs, its sockets and database sessions just vanish."""
        assert self.proc is not None
        self.down = True
        self.proc.kill()

    def call(self, kind: str, data: Any, timeout: float = 10) -> tuple[int, Any]:
        """One protocol request, as the SDKs send it."""
        head = {"corrId": f"{self.name}-{next(_corr)}", "version": VERSION}
        envelope = {"kind": kind, "head": head, "data": data}
        r = httpx.post(f"{self.url}/", json=envelope, timeout=timeout)
        body = r.json()
        return int(body["head"]["status"]), body["data"]

    def promise_value(self, id: str) -> tuple[str, Any]:
        """``(state, decoded value)`` of a promise, read over HTTP."""
        status, data = self.call("promise.get", {"id": id})
        assert status == 200, (self.name, id, status, data)
        promise = data["promise"]
        raw = promise["value"].get("data")
        value = json.loads(base64.b64decode(raw)) if raw is not None else None
        return promise["state"], value


GRANT = re.compile(r"troth\.grants acquired task=(\S+) version=\d+ pid=\S+ corrId=\S+ via=(\S+)")
ACCESS = re.compile(r"troth\.access (\S+) corrId=\S+ status=(\d+)")


class LoggedServer(TrothProcess):
    """``troth serve`` on a SQLite file or a PostgreSQL database, logging at info;
    what it did is read from its log (``test_sdk_hitl.py``, ``test_sdk_bounce.py``).
    Several on one database take a ``name`` each (their process names)."""

    def __init__(
        self,
        procs: Procs,
        store: str,
        db: Path,
        postgres_url: str | None,
        extra: Sequence[str] = (),
        name: str = "server",
    ) -> None:
        super().__init__(procs, name)
        self.store = store
        self.db = db
        self.postgres_url = postgres_url
        self.extra = list(extra)

    def start(self) -> None:
        argv = [
            *[sys.executable, "-m", "troth.cli.main", "serve"],
            *["--host", "127.0.0.1", "--port", str(self.port), "--store", self.store],
            *["--log-level", "info"],
            *self.extra,
        ]
        if self.store == "postgres":
            assert self.postgres_url is not None
            argv += ["--postgres-url", self.postgres_url]
        else:
            argv += ["--db", str(self.db)]
        self.proc = self.procs.start(self.name, argv)
        self.procs.wait_for("GET /ready", self.ready, 30)

    def log(self) -> list[str]:
        assert self.proc is not None
        return self.proc.err().splitlines()

    def acquires(self, task: str) -> int:
        """Leases granted on ``task`` by ``task.acquire`` (not its ``task.create``)."""
        return sum(
            1
            for line in self.log()
            if (m := GRANT.search(line)) and m[1] == task and m[2] == "task.acquire"
        )

    def answered(self, kind: str, status: int) -> int:
        """Requests of ``kind`` answered ``status`` (from the access log)."""
        return sum(
            1
            for line in self.log()
            if (m := ACCESS.search(line)) and m[1] == kind and int(m[2]) == status
        )

    def problems(self) -> list[str]:
        """Tracebacks, error lines and 5xx answers in the server's log."""

        def bad(line: str) -> bool:
            if line.startswith("Traceback") or " ERROR " in line or " CRITICAL " in line:
                return True
            return bool((m := ACCESS.search(line)) and m[2].startswith("5"))

        return [line for line in self.log() if bad(line)]
