"""The limits in ``/metrics`` (troth/flow): ``troth_limit_concurrency``,
``troth_limit_in_use`` and ``troth_limit_held`` by group, read from the store at each
scrape on memory and SQLite, so that they follow every change at once; no series (and
no read of the limits) while no group has a limit."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.support import RunningServer, running_server
from helpers.wire import action
from troth.server.config import Settings
from troth.store.inspection import Inspection, LimitUse

FAR = 10**13
T0 = 1_800_000_000_000


@pytest.fixture(params=["memory", "sqlite"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningServer]:
    db = str(tmp_path / "metrics.db") if request.param == "sqlite" else ":memory:"
    with running_server(Settings(store=request.param, db=db, debug=True)) as s:
        s.ok("debug.start", {})  # the timer paused: only the requests here act
        yield s


def limit(server: RunningServer, group: str, concurrency: int) -> None:
    r = server.client.post("/ops/limits/set", json={"group": group, "concurrency": concurrency})
    assert r.status_code == 200, r.text


def create(server: RunningServer, id: str, group: str) -> None:
    tags = {"resonate:target": f"poll://any@{group}"}
    server.ok("promise.create", {"id": id, "timeoutAt": FAR, "tags": tags}, now=T0)


def gauges(server: RunningServer) -> dict[str, dict[str, int]]:
    """``{metric: {group: value}}`` of the three limit gauges, as scraped now."""
    r = server.client.get("/metrics")
    assert r.status_code == 200
    out: dict[str, dict[str, int]] = {}
    for name, group, value in re.findall(
        r'^(troth_limit_[a-z_]+)\{group="([^"]*)"\} (\S+)$', r.text, re.M
    ):
        out.setdefault(name, {})[group] = int(value)
    return out


def test_the_gauges_follow_slots_and_the_queue_at_each_scrape(node: RunningServer) -> None:
    s = node
    assert gauges(s) == {}
    assert "troth_limit_" not in s.client.get("/metrics").text  # no header for no series
    limit(s, "payments", 2)
    limit(s, "mail", 1)
    for i in range(5):
        create(s, f"p{i}", "payments")
    create(s, "m0", "mail")
    create(s, "free", "other")  # a group with no limit is not shown
    assert gauges(s) == {
        "troth_limit_concurrency": {"mail": 1, "payments": 2},
        "troth_limit_in_use": {"mail": 1, "payments": 2},
        "troth_limit_held": {"mail": 0, "payments": 3},
    }
    # A worker takes p0 and finishes it: p2 takes its slot, one fewer held.
    s.ok("task.acquire", {"id": "p0", "version": 0, "pid": "w", "ttl": 60_000}, now=T0)
    settle = action("promise.settle", {"id": "p0", "state": "resolved", "value": {}})
    s.ok("task.fulfill", {"id": "p0", "version": 1, "action": settle}, now=T0)
    now = gauges(s)
    assert now["troth_limit_in_use"]["payments"] == 2
    assert now["troth_limit_held"]["payments"] == 2
    # Raised: two more go at once.
    limit(s, "payments", 4)
    now = gauges(s)
    assert now["troth_limit_concurrency"]["payments"] == 4
    assert now["troth_limit_in_use"]["payments"] == 4
    assert now["troth_limit_held"]["payments"] == 0
    # Deleted: its series go; the last one deleted, none are left.
    assert s.client.post("/ops/limits/delete", json={"group": "payments"}).status_code == 200
    assert set(gauges(s)["troth_limit_held"]) == {"mail"}
    assert s.client.post("/ops/limits/delete", json={"group": "mail"}).status_code == 200
    assert gauges(s) == {}


def test_the_gauges_agree_with_ops_limits(node: RunningServer) -> None:
    s = node
    limit(s, "batch", 3)
    for i in range(7):
        create(s, f"b{i}", "batch")
    (listed,) = s.client.get("/ops/limits").json()["limits"]
    now = gauges(s)
    assert listed == {
        "group": "batch",
        "concurrency": now["troth_limit_concurrency"]["batch"],
        "inUse": now["troth_limit_in_use"]["batch"],
        "held": now["troth_limit_held"]["batch"],
    }
    assert (listed["inUse"], listed["held"]) == (3, 4)


def test_a_scrape_reads_no_limit_while_there_is_none(
    node: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is asked for the limits only while the node has some: a scrape of a
    server that never had one costs what it cost before flow control."""
    asked: list[str] = []
    inspection = type(node.app.engine.store.inspect(lambda ins: ins))  # this store's
    real = inspection.limits

    def counted(self: Inspection) -> list[LimitUse]:
        asked.append("limits")
        return real(self)

    monkeypatch.setattr(inspection, "limits", counted)
    for _ in range(3):
        assert node.client.get("/metrics").status_code == 200
    assert asked == []
    limit(node, "g", 1)
    assert node.client.get("/metrics").status_code == 200
    assert asked == ["limits"]


def test_a_rate_limit_has_its_gauge_and_no_concurrency(node: RunningServer) -> None:
    s = node
    r = s.client.post("/ops/limits/set", json={"group": "llm", "rate": "120/m"})
    assert r.status_code == 200, r.text
    for i in range(3):
        create(s, f"l{i}", "llm")
    assert gauges(s) == {
        "troth_limit_rate": {"llm": 2.0},
        "troth_limit_in_use": {"llm": 1},
        "troth_limit_held": {"llm": 2},
    }
