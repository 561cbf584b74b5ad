"""Limits on push targets (troth/flow): a limit named ``http://host:port`` caps the
tasks whose ``execute`` troth POSTs to that host, as a group's limit caps its SSE
workers' — the held ones get no POST (no attempt, never failed) until the worker
the host runs acquires and finishes one; a limit named ``nats://subject`` the same
for a NATS subject (on the store, here, with the timer paused)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from flow.test_flow_limits import FAR, executes, flow_server
from helpers.hook import Hook, hook_server
from helpers.support import RunningServer, running_server
from helpers.wire import action
from troth.server.config import Settings

__all__ = ["flow_server"]


def posted(hook: Hook, n: int, within: float = 10.0) -> list[str]:
    """The task ids POSTed to the hook, once there are ``n`` (or the time is up)."""
    deadline = time.monotonic() + within
    while len(hook.seen) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return [body["data"]["task"]["id"] for _, body in hook.seen]


def outbox(server: RunningServer) -> list[dict[str, Any]]:
    r = server.client.get("/ops/outbox")
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()["rows"]
    return rows


def test_a_limit_on_an_http_host_holds_its_pushes(tmp_path: Path) -> None:
    with hook_server() as hook, running_server(Settings(db=str(tmp_path / "p.db"))) as s:
        target = f"http://127.0.0.1:{hook.port}"
        r = s.client.post("/ops/limits/set", json={"group": target, "concurrency": 2})
        assert r.status_code == 200, r.text
        for i in range(5):
            tags = {"resonate:target": f"{target}/work?x={i}"}
            s.ok("promise.create", {"id": f"h{i}", "timeoutAt": FAR, "tags": tags})
        assert posted(hook, 2) == ["h0", "h1"]
        time.sleep(0.3)
        assert len(hook.seen) == 2  # the other three are held: not sent
        (limit,) = s.client.get("/ops/limits").json()["limits"]
        assert (limit["group"], limit["inUse"], limit["held"]) == (target, 2, 3)
        # No delivery of a held task was tried, so none failed.
        assert "failed" not in {row["state"] for row in outbox(s)}
        assert {row["taskId"] for row in outbox(s)} == {"h0", "h1"}
        # The host's worker acquires h0 and finishes it: h2 is POSTed at once.
        s.ok("task.acquire", {"id": "h0", "version": 0, "pid": "w", "ttl": 60_000})
        settle = action("promise.settle", {"id": "h0", "state": "resolved", "value": {}})
        s.ok("task.fulfill", {"id": "h0", "version": 1, "action": settle})
        assert posted(hook, 3) == ["h0", "h1", "h2"]


def test_another_host_and_path_spelling_count_as_written(flow_server: RunningServer) -> None:
    s = flow_server
    r = s.client.post("/ops/limits/set", json={"group": "nats://orders.eu", "concurrency": 1})
    assert r.status_code == 200, r.text
    r = s.client.post("/ops/limits/set", json={"group": "https://api.example.com", "rate": 1})
    assert r.status_code == 200, r.text
    targets = {
        "eu": "nats://orders.eu",
        "api": "https://API.example.com/v1/run",
        "us": "nats://orders.us",
    }
    for i in range(2):
        for name, target in targets.items():
            tags = {"resonate:target": target}
            s.ok("promise.create", {"id": f"{name}{i}", "timeoutAt": FAR, "tags": tags})
    # One of each limited target goes; the subject without a limit gets both.
    assert sorted(executes(s)) == ["api0", "eu0", "us0", "us1"]


@pytest.mark.parametrize(
    "name",
    ["https://api.example.com/v1", "HTTPS://api.example.com", "https://", "ftp://x"],
)
def test_a_push_target_is_written_as_its_host(flow_server: RunningServer, name: str) -> None:
    r = flow_server.client.post("/ops/limits/set", json={"group": name, "concurrency": 1})
    assert r.status_code == 400, r.text
    assert "push target is written" in r.json()["error"]
