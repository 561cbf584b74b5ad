"""Keys and fairness (troth/flow, docs/operations.md "Flow control"), on the wire with
the timer paused, on memory, SQLite and PostgreSQL: a task tagged ``troth:key``
counts against ``perKey`` of its group; held tasks go round-robin across keys, so
that a key with many held tasks does not starve a key with one; priority still goes
first; the retry timer re-sending to a held task does not move it back."""

from __future__ import annotations

from typing import Any

from flow.test_flow_limits import FAR, GROUP, T0, acquire, executes, flow_server, limits
from helpers.support import RunningServer
from helpers.wire import action

__all__ = ["flow_server"]


def set_limit(server: RunningServer, **caps: Any) -> dict[str, Any]:
    r = server.client.post("/ops/limits/set", json={"group": GROUP, **caps})
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def create(
    server: RunningServer, id: str, key: str | None = None, priority: int | str = 0, now: int = T0
) -> None:
    tags = {"resonate:target": f"poll://any@{GROUP}"}
    if key is not None:
        tags["troth:key"] = key
    if priority:
        tags["troth:priority"] = str(priority)
    server.ok("promise.create", {"id": id, "timeoutAt": FAR, "tags": tags}, now=now)


def finish(server: RunningServer, id: str) -> None:
    """A worker takes the task it was sent and fulfils it."""
    assert acquire(server, id)[0] == 200
    settle = action("promise.settle", {"id": id, "state": "resolved", "value": {}})
    server.ok("task.fulfill", {"id": id, "version": 1, "action": settle}, now=T0)


def started_in_turn(server: RunningServer, ids: list[str], first: str) -> list[str]:
    """Finish ``first`` and then each task as it is let through (a limit of one):
    the order they were let through."""
    order = []
    running = first
    for _ in ids:
        finish(server, running)
        sent = [t for t in executes(server) if t in ids and t not in order]
        assert len(sent) == 1, sent
        running = sent[0]
        order.append(running)
    return order


def test_per_key_caps_one_key_and_lets_the_others_run(flow_server: RunningServer) -> None:
    s = flow_server
    answer = set_limit(s, concurrency=10, perKey=2)
    assert answer["perKey"] == 2
    for i in range(3):
        create(s, f"a{i}", key="acme")
    for i in range(2):
        create(s, f"b{i}", key="bolt")
    create(s, "n0")  # no key: the key "" of its own
    assert sorted(executes(s)) == ["a0", "a1", "b0", "b1", "n0"]
    assert limits(s)[GROUP] == {
        "group": GROUP,
        "concurrency": 10,
        "perKey": 2,
        "inUse": 5,
        "held": 1,
    }
    status, body = acquire(s, "a2")
    assert status == 409 and "per-key limit of group fc: key 'acme' has 2 of 2" in str(body)
    finish(s, "a0")
    assert "a2" in executes(s)
    assert limits(s)[GROUP]["held"] == 0


def test_a_key_with_many_held_tasks_does_not_starve_one_with_few(
    flow_server: RunningServer,
) -> None:
    s = flow_server
    set_limit(s, concurrency=1)
    create(s, "first")
    for i in range(6):
        create(s, f"big{i}", key="big")
    create(s, "small0", key="small")
    create(s, "small1", key="small")
    order = started_in_turn(s, [f"big{i}" for i in range(6)] + ["small0", "small1"], "first")
    assert order == ["big0", "small0", "big1", "small1", "big2", "big3", "big4", "big5"]


def test_priority_goes_before_turns(flow_server: RunningServer) -> None:
    s = flow_server
    set_limit(s, concurrency=1)
    create(s, "first")
    create(s, "a0", key="a")
    create(s, "a1", key="a")
    create(s, "b0", key="b", priority=5)
    create(s, "b1", key="b", priority=5)
    order = started_in_turn(s, ["a0", "a1", "b0", "b1"], "first")
    assert order == ["b0", "b1", "a0", "a1"]


def test_the_retry_timer_does_not_move_a_held_task_back(flow_server: RunningServer) -> None:
    s = flow_server
    set_limit(s, concurrency=1)
    create(s, "first")
    create(s, "early")
    create(s, "late", now=T0 + 1000)
    # The retry timer re-offers "early" (5 s after it was created), not yet "late".
    s.ok("debug.tick", {"time": T0 + 5000}, now=T0 + 5000)
    assert executes(s) == ["first"]
    order = started_in_turn(s, ["early", "late"], "first")
    assert order == ["early", "late"]


def test_a_priority_not_written_as_a_plain_integer_counts_as_0(
    flow_server: RunningServer,
) -> None:
    """ " 9" and "1_0" are integers to Python's ``int``, not as written: both count as 0
    and go after "2", in the order they were created."""
    s = flow_server
    set_limit(s, concurrency=1)
    create(s, "first")
    create(s, "spaced", priority=" 9")
    create(s, "underscored", priority="1_0")
    create(s, "two", priority="2")
    order = started_in_turn(s, ["spaced", "underscored", "two"], "first")
    assert order == ["two", "spaced", "underscored"]


def test_a_priority_beyond_the_column_counts_as_its_bound(flow_server: RunningServer) -> None:
    s = flow_server
    set_limit(s, concurrency=1)
    create(s, "first")
    create(s, "low", priority=-(10**30))
    create(s, "mid")
    create(s, "high", priority=10**30)
    create(s, "max", priority=2**31 - 1)  # the bound itself: created later, goes after
    order = started_in_turn(s, ["low", "mid", "high", "max"], "first")
    assert order == ["high", "max", "mid", "low"]
