"""Concurrency limits per worker group (troth/flow, docs/operations.md "Flow control"),
driven over the wire on memory, SQLite and PostgreSQL: a task beyond the limit stays pending with
no ``execute``; a freed slot lets the next queued task go in the same commit, by
``troth:priority`` then by creation; an acquire beyond the limit is refused (409) and
changes nothing; setting, raising and deleting a limit take effect at once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from helpers.pg import throwaway_database
from helpers.support import RunningServer, running_server
from helpers.wire import action
from troth.server.config import Settings

FAR = 10**13
T0 = 1_800_000_000_000
GROUP = "fc"


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def flow_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningServer]:
    with ExitStack() as stack:
        if request.param == "postgres":
            url = stack.enter_context(throwaway_database("troth_flow"))
            settings = Settings(store="postgres", postgres_url=url, debug=True)
        else:
            db = str(tmp_path / "flow.db") if request.param == "sqlite" else ":memory:"
            settings = Settings(store=request.param, db=db, debug=True)
        s = stack.enter_context(running_server(settings))
        s.ok("debug.start", {})  # the timer paused: only the requests here act
        yield s


def set_limit(server: RunningServer, concurrency: int, group: str = GROUP) -> dict[str, Any]:
    r = server.client.post("/ops/limits/set", json={"group": group, "concurrency": concurrency})
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def limits(server: RunningServer) -> dict[str, dict[str, Any]]:
    r = server.client.get("/ops/limits")
    assert r.status_code == 200, r.text
    return {x["group"]: x for x in r.json()["limits"]}


def create(server: RunningServer, id: str, priority: int | None = None) -> None:
    tags = {"resonate:target": f"poll://any@{GROUP}"}
    if priority is not None:
        tags["troth:priority"] = str(priority)
    server.ok("promise.create", {"id": id, "timeoutAt": FAR, "tags": tags}, now=T0)


def executes(server: RunningServer) -> list[str]:
    """The tasks with an ``execute`` in the outbox, oldest row first."""
    rows = server.ok("debug.snap", {})["outbox"]
    return [r["message"]["taskId"] for r in rows if r["message"]["kind"] == "execute"]


def acquire(server: RunningServer, id: str, version: int = 0) -> tuple[int, Any]:
    body = {"id": id, "version": version, "pid": "w", "ttl": 60_000}
    return server.call("task.acquire", body, now=T0)


def fulfil(server: RunningServer, id: str, version: int = 1) -> None:
    settle = action("promise.settle", {"id": id, "state": "resolved", "value": {}})
    server.ok("task.fulfill", {"id": id, "version": version, "action": settle}, now=T0)


def test_a_group_runs_at_most_its_limit_and_a_freed_slot_goes_at_once(
    flow_server: RunningServer,
) -> None:
    s = flow_server
    set_limit(s, 2)
    for i in range(4):
        create(s, f"t{i}")
    assert executes(s) == ["t0", "t1"]
    assert limits(s)[GROUP] == {"group": GROUP, "concurrency": 2, "inUse": 2, "held": 2}
    assert acquire(s, "t0")[0] == 200
    assert acquire(s, "t1")[0] == 200
    status, message = acquire(s, "t2")
    assert status == 409
    assert message == f"Task is held by the concurrency limit of group {GROUP}: 2 of 2 in use"
    fulfil(s, "t0")
    # The fulfil's own commit wrote the next task's execute.
    assert "t2" in executes(s) and "t3" not in executes(s)
    assert acquire(s, "t2")[0] == 200
    assert acquire(s, "t3")[0] == 409
    assert limits(s)[GROUP]["inUse"] == 2 and limits(s)[GROUP]["held"] == 1


def test_a_refused_acquire_changes_nothing(flow_server: RunningServer) -> None:
    s = flow_server
    set_limit(s, 1)
    create(s, "a")
    create(s, "b")
    assert acquire(s, "a")[0] == 200
    before = s.ok("debug.snap", {})
    assert acquire(s, "b")[0] == 409
    assert s.ok("debug.snap", {}) == before
    assert s.ok("task.get", {"id": "b"})["task"]["state"] == "pending"


def test_priority_orders_the_held_tasks_then_creation(flow_server: RunningServer) -> None:
    s = flow_server
    set_limit(s, 1)
    create(s, "first")  # the slot is free: it goes at once
    for id, priority in (("low1", 0), ("high1", 9), ("low2", None), ("high2", 9)):
        create(s, id, priority)
    started = ["first"]
    assert acquire(s, "first")[0] == 200
    for _ in range(4):
        fulfil(s, started[-1])
        admitted = [t for t in executes(s) if t not in started]
        assert len(admitted) == 1, admitted
        started.append(admitted[0])
        assert acquire(s, admitted[0])[0] == 200
    assert started == ["first", "high1", "high2", "low1", "low2"]


def test_release_frees_the_slot_for_the_first_in_the_queue(flow_server: RunningServer) -> None:
    s = flow_server
    set_limit(s, 1)
    create(s, "a")
    create(s, "b", priority=5)
    assert acquire(s, "a")[0] == 200
    s.ok("task.release", {"id": "a", "version": 1}, now=T0)
    # b comes before a in the queue (its priority): b gets the slot, a waits.
    assert executes(s) == ["b"]
    assert acquire(s, "b")[0] == 200
    assert acquire(s, "a", version=1)[0] == 409


def test_suspend_frees_the_slot(flow_server: RunningServer) -> None:
    s = flow_server
    set_limit(s, 1)
    create(s, "a")
    create(s, "b")
    external = {"resonate:scope": "global"}
    s.ok("promise.create", {"id": "x", "timeoutAt": FAR, "tags": external}, now=T0)
    assert acquire(s, "a")[0] == 200
    rc = action("promise.register_callback", {"awaited": "x", "awaiter": "a"})
    s.ok("task.suspend", {"id": "a", "version": 1, "actions": [rc]}, now=T0)
    assert s.ok("task.get", {"id": "a"})["task"]["state"] == "suspended"
    assert "b" in executes(s)
    assert limits(s)[GROUP]["inUse"] == 1


def test_an_expired_lease_frees_the_slot(flow_server: RunningServer) -> None:
    s = flow_server
    set_limit(s, 1)
    create(s, "a")
    create(s, "b", priority=1)
    s.ok("task.acquire", {"id": "a", "version": 0, "pid": "w", "ttl": 1000}, now=T0)
    s.ok("debug.tick", {"time": T0 + 5000}, now=T0 + 5000)
    assert s.ok("task.get", {"id": "a"})["task"]["state"] == "pending"
    assert executes(s) == ["b"]


def test_a_new_limit_counts_the_tasks_running_now(flow_server: RunningServer) -> None:
    s = flow_server
    for i in range(3):
        create(s, f"r{i}")
        assert acquire(s, f"r{i}")[0] == 200
    assert set_limit(s, 2)["inUse"] == 3
    create(s, "new")
    assert "new" not in executes(s)
    fulfil(s, "r0")
    assert "new" not in executes(s)  # 2 of 2 still in use
    fulfil(s, "r1")
    assert "new" in executes(s)


def test_raising_or_deleting_the_limit_lets_held_tasks_go_at_once(
    flow_server: RunningServer,
) -> None:
    s = flow_server
    set_limit(s, 1)
    for i in range(5):
        create(s, f"t{i}")
    assert executes(s) == ["t0"]
    assert set_limit(s, 3)["admitted"] == 2
    assert executes(s) == ["t0", "t1", "t2"]
    r = s.client.post("/ops/limits/delete", json={"group": GROUP})
    assert r.status_code == 200 and r.json()["admitted"] == 2
    assert sorted(executes(s)) == ["t0", "t1", "t2", "t3", "t4"]
    assert limits(s) == {}
    # Without a limit nothing is held any more, and an acquire is never refused.
    create(s, "t5")
    assert "t5" in executes(s)
    assert all(acquire(s, f"t{i}")[0] == 200 for i in range(6))


def test_other_groups_are_not_limited(flow_server: RunningServer) -> None:
    s = flow_server
    set_limit(s, 1)
    for i in range(3):
        s.ok(
            "promise.create",
            {"id": f"o{i}", "timeoutAt": FAR, "tags": {"resonate:target": "poll://any@other"}},
            now=T0,
        )
    assert executes(s) == ["o0", "o1", "o2"]
    assert all(acquire(s, f"o{i}")[0] == 200 for i in range(3))


def test_a_settled_held_task_leaves_the_queue(flow_server: RunningServer) -> None:
    s = flow_server
    set_limit(s, 1)
    create(s, "a")
    create(s, "b")
    create(s, "c")
    assert acquire(s, "a")[0] == 200
    s.ok("promise.settle", {"id": "b", "state": "rejected_canceled", "value": {}}, now=T0)
    assert limits(s)[GROUP]["held"] == 1  # only c waits now
    fulfil(s, "a")
    assert "c" in executes(s) and "b" not in executes(s)


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/ops/limits/set", {"group": GROUP}, 400, "needs a concurrency, a rate, a per-key"),
        ("/ops/limits/set", {"group": GROUP, "rate": "fast"}, 400, "R/s, R/m or R/h"),
        ("/ops/limits/set", {"group": GROUP, "rate": 0}, 400, "above 0"),
        (
            "/ops/limits/set",
            {"group": GROUP, "concurrency": 2, "burst": 3},
            400,
            "goes with a rate",
        ),
        ("/ops/limits/set", {"group": GROUP, "rate": 5, "burst": 0}, 400, "burst must be"),
        ("/ops/limits/set", {"group": GROUP, "concurrency": 0}, 400, "between 1"),
        ("/ops/limits/set", {"group": GROUP, "concurrency": "3"}, 400, "bad body"),
        ("/ops/limits/set", {"group": "FC", "concurrency": 3}, 400, "lower case"),
        ("/ops/limits/set", {"group": "", "concurrency": 3}, 400, "needs a group"),
        ("/ops/limits/set", {"group": GROUP, "concurrency": 3, "x": 1}, 400, "bad body"),
        ("/ops/limits/delete", {"group": "none"}, 404, "has no limit"),
    ],
)
def test_a_bad_limit_is_refused_and_changes_nothing(
    flow_server: RunningServer, path: str, body: Any, status: int, says: str
) -> None:
    set_limit(flow_server, 4, group="kept")
    r = flow_server.client.post(path, json=body)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]
    assert limits(flow_server) == {
        "kept": {"group": "kept", "concurrency": 4, "inUse": 0, "held": 0}
    }


def test_limits_outlive_a_restart(tmp_path: Path) -> None:
    db = str(tmp_path / "kept.db")
    with running_server(Settings(db=db, debug=True)) as s:
        s.ok("debug.start", {})
        set_limit(s, 1)
        create(s, "a")
        create(s, "b")
    with running_server(Settings(db=db, debug=True)) as s:
        s.ok("debug.start", {})
        assert limits(s)[GROUP] == {"group": GROUP, "concurrency": 1, "inUse": 1, "held": 1}
        assert acquire(s, "b")[0] == 409
        assert acquire(s, "a")[0] == 200
