"""The wire vocabulary of the server-level tests (test_spec_points.py,
test_outbox_sites.py, test_guards.py): tags, nested request envelopes, and what
``debug.snap`` holds of the outbox and of a task.
"""

from __future__ import annotations

from typing import Any

from helpers.support import RunningServer

TARGET = "poll://any@workers"
TGT = {"resonate:target": TARGET}
EXT = {"resonate:external": "true"}
TIMER = {"resonate:timer": "true"}
RETRY = 5000  # the server's retryTimeout (SPEC.md §2.2 ServerConfig)


def action(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """A nested request envelope (task.create / fence / suspend / fulfill actions)."""
    return {"kind": kind, "head": {}, "data": data}


def rc(awaited: str, awaiter: str) -> dict[str, Any]:
    return action("promise.register_callback", {"awaited": awaited, "awaiter": awaiter})


def stored_task(server: RunningServer, id: str) -> dict[str, Any]:
    rows = [t for t in server.snap()["tasks"] if t["id"] == id]
    assert len(rows) == 1, rows
    row: dict[str, Any] = rows[0]
    return row


def execute(id: str, version: int, created_at: int, address: str = TARGET) -> dict[str, Any]:
    """What ``server.outbox()[id]`` must hold for an execute (row id not compared)."""
    return {
        "key": id,
        "address": address,
        "message": {"kind": "execute", "taskId": id, "version": version},
        "createdAt": created_at,
    }


def rows(server: RunningServer) -> dict[str, dict[str, Any]]:
    """Pending outbox rows by key, without the row id / delivery bookkeeping."""
    return {
        k: {f: r[f] for f in ("key", "address", "message", "createdAt")}
        for k, r in server.outbox().items()
    }
