"""Test support: a real troth server on a real socket, in a background thread.

Tests talk to it over HTTP exactly as the SDKs do.  ``RunningServer.call`` sends one
envelope and returns ``(status, data)``; ``now`` sets ``resonate:debug_time``.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx
import uvicorn

from troth.server.config import Settings
from troth.server.http.app import App
from troth.server.run import build_app, uvicorn_config
from troth.store.base import Store

VERSION = "2026-04-01"
_corr = itertools.count(1)


def wait_for(
    what: str, check: Callable[[], object], timeout: float = 10.0, every: float = 0.02
) -> None:
    """Poll ``check`` every ``every`` seconds until it holds; fail the test saying
    ``what`` did not happen."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class RunningServer:
    url: str
    app: App
    client: httpx.Client
    settings: Settings
    #: The uvicorn server (its ``config.http`` is troth's protocol class).
    server: uvicorn.Server | None = None

    def envelope(self, kind: str, data: Any, now: int | None = None) -> dict[str, Any]:
        head: dict[str, Any] = {"corrId": f"t-{next(_corr)}", "version": VERSION}
        if now is not None:
            head["resonate:debug_time"] = now
        return {"kind": kind, "head": head, "data": data}

    def raw(self, kind: str, data: Any, now: int | None = None) -> httpx.Response:
        return self.client.post("/", json=self.envelope(kind, data, now))

    def call(self, kind: str, data: Any, now: int | None = None) -> tuple[int, Any]:
        env = self.envelope(kind, data, now)
        r = self.client.post("/", json=env)
        body = r.json()
        assert body["kind"] == kind, body
        assert body["head"]["corrId"] == env["head"]["corrId"], body
        assert r.status_code == body["head"]["status"], (r.status_code, body)
        return body["head"]["status"], body["data"]

    def ok(self, kind: str, data: Any, now: int | None = None) -> Any:
        status, body = self.call(kind, data, now)
        assert status == 200, (kind, status, body)
        return body

    def reset(self) -> None:
        self.ok("debug.reset", {})
        self.ok("debug.start", {})

    def tick(self, now: int) -> None:
        self.ok("debug.tick", {"time": now}, now)

    def snap(self) -> dict[str, Any]:
        result: dict[str, Any] = self.ok("debug.snap", {})
        return result

    def outbox(self) -> dict[str, dict[str, Any]]:
        """Pending outbox rows by key."""
        return {r["key"]: r for r in self.snap()["outbox"] if r["state"] == "pending"}


@contextmanager
def running_server(settings: Settings, store: Store | None = None) -> Iterator[RunningServer]:
    """Serve ``settings`` on a free port until the block ends (graceful shutdown)."""
    port = free_port()
    settings = replace(settings, host="127.0.0.1", port=port)
    app = build_app(settings, store)
    config = uvicorn_config(
        app,
        settings,
        loop="asyncio",
        log_level="warning",
        timeout_graceful_shutdown=None,
        # Longer than httpx's 5 s keep-alive expiry: the client always drops an idle
        # connection first, so a reused one is never reset by the server mid-request
        # (with both at 5 s, a loaded machine made that race, and /metrics failed).
        # A test that sets idle_timeout itself gets what it set.
        timeout_keep_alive=60
        if settings.idle_timeout == Settings.idle_timeout
        else settings.idle_timeout,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.01)
    url = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=url, timeout=30) as client:
        try:
            yield RunningServer(url, app, client, settings, server)
        finally:
            server.should_exit = True
            thread.join(15)
