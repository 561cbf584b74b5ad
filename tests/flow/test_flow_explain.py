"""``troth explain`` of a task held by its group's concurrency limit (troth/flow), on
memory and SQLite: the finding names the group, the slots in use of the limit, and
how many held tasks go before it (by ``troth:priority``, then creation, then id); a
workflow suspended on such a task walks down to it; the CLI prints the same line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.support import RunningServer, running_server
from helpers.wire import action, rc
from troth.cli.main import main
from troth.server.config import Settings

FAR = 10**13
T0 = 1_800_000_000_000
GROUP = "payments"


@pytest.fixture(params=["memory", "sqlite"])
def limited(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningServer]:
    db = str(tmp_path / "explain.db") if request.param == "sqlite" else ":memory:"
    with running_server(Settings(store=request.param, db=db, debug=True)) as s:
        s.ok("debug.start", {})  # the timer paused: only the requests here act
        r = s.client.post("/ops/limits/set", json={"group": GROUP, "concurrency": 2})
        assert r.status_code == 200, r.text
        yield s


def create(
    server: RunningServer, id: str, group: str = GROUP, priority: int | None = None, **tags: str
) -> None:
    tags = {"resonate:target": f"poll://any@{group}", **tags}
    if priority is not None:
        tags["troth:priority"] = str(priority)
    server.ok("promise.create", {"id": id, "timeoutAt": FAR, "tags": tags}, now=T0)


def explained(server: RunningServer, id: str) -> dict[str, Any]:
    r = server.client.get("/ops/explain", params={"id": id})
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def test_a_held_task_names_its_limit_and_its_place_in_the_queue(
    limited: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    s = limited
    create(s, "t0")
    create(s, "t1")  # both take the two slots: their executes go
    create(s, "t2")
    create(s, "t3", priority=5)
    create(s, "t4")
    create(s, "t5", priority=-1)
    # The queue: t3 (priority 5), t2, t4 (first created first), t5 (priority -1).
    ahead = {"t3": 0, "t2": 1, "t4": 2, "t5": 3}
    for id, n in ahead.items():
        answer = explained(s, id)
        root = answer["root"]
        assert root["reason"] == "held_by_limit", root
        tasks = "task" if n == 1 else "tasks"
        assert root["text"].startswith(
            f"held by the concurrency limit of group `{GROUP}`: 2 of 2 in use, {n} {tasks} ahead"
        ), root["text"]
        assert root["evidence"]["group"] == GROUP
        assert root["evidence"]["limit"]["ahead"] == n
        assert answer["blockers"] == [{"id": id, "reason": "held_by_limit", "text": root["text"]}]
    assert explained(s, "t3")["root"]["text"].endswith("(its troth:priority 5)")
    assert explained(s, "t5")["root"]["text"].endswith("(its troth:priority -1)")
    # A task with a slot is explained as any other: its execute went out.
    assert explained(s, "t0")["root"]["reason"] == "no_worker"

    # A worker takes t0 and finishes it: t3 gets the freed slot, the others move up.
    s.ok("task.acquire", {"id": "t0", "version": 0, "pid": "w", "ttl": 60_000}, now=T0)
    settle = action("promise.settle", {"id": "t0", "state": "resolved", "value": {}})
    s.ok("task.fulfill", {"id": "t0", "version": 1, "action": settle}, now=T0)
    assert explained(s, "t3")["root"]["reason"] == "no_worker"
    assert explained(s, "t4")["root"]["evidence"]["limit"] == {
        "concurrency": 2,
        "inUse": 2,
        "ahead": 1,
        "priority": 0,
    }

    code = main(["explain", "t4", "--server", s.url])
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[0] == (
        f"t4  pending: held by the concurrency limit of group `{GROUP}`: "
        "2 of 2 in use, 1 task ahead"
    )
    assert out.splitlines()[-1] == "(1 blocker: held_by_limit)"


def test_a_workflow_suspended_on_a_held_task_walks_down_to_the_limit(
    limited: RunningServer,
) -> None:
    s = limited
    create(s, "busy1")
    create(s, "busy2")
    create(s, "wf", group="orders", **{"resonate:origin": "wf"})
    lineage = {"resonate:origin": "wf", "resonate:parent": "wf"}
    create(s, "wf.charge", **lineage)
    s.ok("task.acquire", {"id": "wf", "version": 0, "pid": "w", "ttl": 60_000}, now=T0)
    s.ok("task.suspend", {"id": "wf", "version": 1, "actions": [rc("wf.charge", "wf")]}, now=T0)
    answer = explained(s, "wf")
    assert answer["root"]["reason"] == "awaiting"
    (child,) = answer["root"]["awaiting"]
    assert child["id"] == "wf.charge" and child["reason"] == "held_by_limit"
    assert "2 of 2 in use, 0 tasks ahead" in child["text"]
    assert [b["reason"] for b in answer["blockers"]] == ["held_by_limit"]


def test_after_the_limit_is_deleted_nothing_is_held(limited: RunningServer) -> None:
    s = limited
    for id in ("a", "b", "c"):
        create(s, id)
    assert explained(s, "c")["root"]["reason"] == "held_by_limit"
    assert s.client.post("/ops/limits/delete", json={"group": GROUP}).status_code == 200
    assert explained(s, "c")["root"]["reason"] == "no_worker"


def test_a_task_held_by_its_key_or_by_the_rate_says_which(limited: RunningServer) -> None:
    s = limited
    r = s.client.post("/ops/limits/set", json={"group": "keyed", "concurrency": 5, "perKey": 1})
    assert r.status_code == 200, r.text
    create(s, "k0", group="keyed", **{"troth:key": "acme"})
    create(s, "k1", group="keyed", **{"troth:key": "acme"})
    finding = explained(s, "k1")["root"]
    assert finding["reason"] == "held_by_limit"
    assert (
        "per-key limit of group `keyed`: key `acme` has 1 of 1 in use, 0 tasks ahead"
        in (finding["text"])
    )
    assert finding["evidence"]["limit"]["perKey"] == 1
    r = s.client.post("/ops/limits/set", json={"group": "rated", "rate": "1/m"})
    assert r.status_code == 200, r.text
    create(s, "r0", group="rated")
    create(s, "r1", group="rated")
    finding = explained(s, "r1")["root"]
    assert "held by the rate limit of group `rated`: 1/m, 0 tasks ahead" in (finding["text"])
