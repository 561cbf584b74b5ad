"""``POST /ops/cancel`` (server/operator/cancel.py): a workflow's pending promises settled
``rejected_canceled``, the root first, in bounded transactions, on every backend.
The tree is built with the protocol's own requests, as a worker builds it."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

import troth.server.operator.cancel as cancel_module
from helpers.support import RunningServer
from helpers.wire import action, rc

FAR = 10**13
T = {"resonate:target": "poll://any@wf"}


def origin(root: str, **more: str) -> dict[str, str]:
    return {"resonate:origin": root, **more}


def cancel(server: RunningServer, body: Any) -> tuple[int, Any]:
    r = server.client.post("/ops/cancel", json=body)
    return r.status_code, r.json()


def state(server: RunningServer, id: str) -> str:
    s: str = server.ok("promise.get", {"id": id})["promise"]["state"]
    return s


def workflow(server: RunningServer, root: str) -> None:
    """``root`` acquired by a worker and suspended on its child ``.1`` (a task of its
    own, pending); ``.2`` (no task, a listener), ``.3`` already resolved; and a
    grandchild ``.1.1`` of ``.1``."""
    server.ok("promise.create", {"id": root, "timeoutAt": FAR, "tags": {**T, **origin(root)}})
    server.ok("task.acquire", {"id": root, "version": 0, "pid": "p1", "ttl": 600_000})
    for child, tags in (
        (f"{root}.1", {**T, **origin(root)}),
        (f"{root}.2", origin(root, **{"resonate:external": "true"})),
        (f"{root}.3", origin(root)),
        (f"{root}.1.1", origin(root, **{"resonate:parent": f"{root}.1"})),
    ):
        fence = {"id": child, "timeoutAt": FAR, "tags": tags}
        body = {"id": root, "version": 1, "action": action("promise.create", fence)}
        assert server.ok("task.fence", body)["action"]["head"]["status"] == 200
    server.ok(
        "promise.register_listener", {"awaited": f"{root}.2", "address": "poll://any@listeners"}
    )
    server.ok("promise.settle", {"id": f"{root}.3", "state": "resolved"})
    body = {"id": root, "version": 1, "actions": [rc(f"{root}.1", root)]}
    assert server.call("task.suspend", body)[0] == 200


def test_a_workflow_is_cancelled_whole_and_nothing_else(server: RunningServer) -> None:
    workflow(server, "wf")
    workflow(server, "other")
    status, answer = cancel(server, {"id": "wf", "reason": "customer withdrew"})
    assert status == 200, answer
    assert answer["canceled"] == 4  # wf, wf.1, wf.2, wf.1.1; wf.3 was resolved
    assert answer["pendingLeft"] == 0
    assert answer["first"][0] == "wf"  # the root first
    for id in ("wf", "wf.1", "wf.2", "wf.1.1"):
        p = server.ok("promise.get", {"id": id})["promise"]
        assert p["state"] == "rejected_canceled", id
        assert json.loads(base64.b64decode(p["value"]["data"])) == {"reason": "customer withdrew"}
    assert state(server, "wf.3") == "resolved"
    # Nothing outside the tree changed.
    for id in ("other", "other.1", "other.2", "other.1.1"):
        assert state(server, id) == "pending", id
    # Their tasks ended: the root's task, suspended on wf.1, was not resumed by wf.1's
    # settle (no further step), and wf.1's task is fulfilled.
    tasks = {t["id"]: t for t in server.snap()["tasks"]}
    assert tasks["wf"]["state"] == "fulfilled"
    assert tasks["wf.1"]["state"] == "fulfilled"
    assert tasks["other"]["state"] == "suspended"
    # No execute beyond each task's first (version 0, written at its birth).
    rows = server.snap()["outbox"]
    executes = [(r["key"], r["message"]["version"]) for r in rows if r["key"] in ("wf", "wf.1")]
    assert sorted(executes) == [("wf", 0), ("wf.1", 0)]
    # The listener got its unblock.
    assert "wf.2:notify:poll://any@listeners" in server.outbox()


def test_a_worker_of_a_cancelled_workflow_is_refused(server: RunningServer) -> None:
    server.ok("promise.create", {"id": "run", "timeoutAt": FAR, "tags": {**T, **origin("run")}})
    server.ok("task.acquire", {"id": "run", "version": 0, "pid": "p1", "ttl": 600_000})
    assert cancel(server, {"id": "run"})[0] == 200
    child = action("promise.create", {"id": "run.9", "timeoutAt": FAR, "tags": origin("run")})
    assert server.call("task.fence", {"id": "run", "version": 1, "action": child})[0] == 409
    settle = action("promise.settle", {"id": "run", "state": "resolved"})
    assert server.call("task.fulfill", {"id": "run", "version": 1, "action": settle})[0] == 409
    with pytest.raises(AssertionError):
        server.ok("promise.get", {"id": "run.9"})  # the fenced create did not happen
    value = server.ok("promise.get", {"id": "run"})["promise"]["value"]
    assert json.loads(base64.b64decode(value["data"])) == {"reason": "canceled by an operator"}


def test_a_second_cancel_changes_nothing(server: RunningServer) -> None:
    workflow(server, "wf")
    assert cancel(server, {"id": "wf"})[1]["canceled"] == 4
    before = server.snap()
    status, answer = cancel(server, {"id": "wf"})
    assert (status, answer["canceled"], answer["passes"]) == (200, 0, 0)
    assert server.snap()["promises"] == before["promises"]


def test_a_big_tree_goes_in_bounded_transactions(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cancel_module, "CHUNK", 7)
    server.ok("promise.create", {"id": "big", "timeoutAt": FAR, "tags": origin("big")})
    for i in range(40):
        server.ok("promise.create", {"id": f"big.{i}", "timeoutAt": FAR, "tags": origin("big")})
    status, answer = cancel(server, {"id": "big"})
    assert (status, answer["canceled"], answer["pendingLeft"]) == (200, 41, 0)
    states = {p["id"]: p["state"] for p in server.snap()["promises"]}
    assert set(states.values()) == {"rejected_canceled"}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"id": "nobody"}, 404, "no promise 'nobody'"),
        ({}, 400, "bad body"),
        ({"id": ""}, 400, "id must be"),
        ({"id": "wf", "reason": "x" * 1001}, 400, "reason is at most"),
        ({"id": "wf", "surprise": 1}, 400, "bad body"),
        ([1, 2], 400, "bad body"),
    ],
)
def test_a_bad_cancel_is_refused_and_changes_nothing(
    server: RunningServer, body: Any, status: int, message: str
) -> None:
    workflow(server, "wf")
    before = server.snap()["promises"]
    got, answer = cancel(server, body)
    assert got == status and message in answer["error"], answer
    assert server.snap()["promises"] == before


def test_an_unknown_action_is_404(server: RunningServer) -> None:
    r = server.client.post("/ops/nothing", json={})
    assert r.status_code == 404 and "/ops/cancel" in r.json()["error"]
