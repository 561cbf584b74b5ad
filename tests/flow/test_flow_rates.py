"""Rate limits per worker group (troth/flow, docs/operations.md "Flow control"), on the
wire with the timer paused and time given by each request, on memory, SQLite and
PostgreSQL: at most ``rate`` starts per second after a burst of ``burst``; a task
held by the rate gets its ``execute`` when its token comes (the timer re-offers it
then); an acquire without a token is refused and changes nothing; a rate and a
concurrency together hold to both."""

from __future__ import annotations

from typing import Any

import pytest

from flow.test_flow_limits import (
    GROUP,
    T0,
    acquire,
    create,
    executes,
    flow_server,
    fulfil,
    limits,
)
from helpers.support import RunningServer

__all__ = ["flow_server"]


def set_rate(
    server: RunningServer, rate: Any, burst: int | None = None, concurrency: int | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"group": GROUP, "rate": rate}
    if burst is not None:
        body["burst"] = burst
    if concurrency is not None:
        body["concurrency"] = concurrency
    r = server.client.post("/ops/limits/set", json=body)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def tick(server: RunningServer, at: int) -> None:
    server.ok("debug.tick", {"time": at}, now=at)


def test_a_rate_lets_one_start_per_interval_and_the_timer_brings_the_next(
    flow_server: RunningServer,
) -> None:
    s = flow_server
    answer = set_rate(s, "2/s")  # one token every 500 ms, a bucket of one
    assert (answer["rate"], answer["burst"], answer["concurrency"]) == (2.0, 1, None)
    for id in "abcd":
        create(s, id)
    assert executes(s) == ["a"]
    assert limits(s)[GROUP]["held"] == 3
    # The first held task is re-offered when the next token comes: not before.
    tick(s, T0 + 499)
    assert executes(s) == ["a"]
    tick(s, T0 + 500)
    assert executes(s) == ["a", "b"]
    tick(s, T0 + 1000)
    tick(s, T0 + 1500)
    assert executes(s) == ["a", "b", "c", "d"]
    assert limits(s)[GROUP]["held"] == 0


def test_a_burst_goes_at_once_then_the_rate_holds(flow_server: RunningServer) -> None:
    s = flow_server
    set_rate(s, 10, burst=3)
    for i in range(6):
        create(s, f"t{i}")
    assert executes(s) == ["t0", "t1", "t2"]
    tick(s, T0 + 100)
    assert executes(s) == ["t0", "t1", "t2", "t3"]
    # A late timer does not bring a burst beyond the bucket: 250 ms is two tokens.
    tick(s, T0 + 350)
    assert len(executes(s)) == 6


def test_an_acquire_without_a_token_is_refused_and_changes_nothing(
    flow_server: RunningServer,
) -> None:
    s = flow_server
    set_rate(s, "1/s")
    create(s, "a")
    create(s, "b")
    assert acquire(s, "a")[0] == 200
    before = s.ok("debug.snap", {})
    status, body = acquire(s, "b")
    assert status == 409
    assert "rate limit of group fc: 1/s, the next start in" in str(body)
    assert s.ok("debug.snap", {}) == before
    assert limits(s)[GROUP]["inUse"] == 1


def test_rate_and_concurrency_hold_together(flow_server: RunningServer) -> None:
    s = flow_server
    set_rate(s, 100, burst=10, concurrency=2)
    for i in range(5):
        create(s, f"t{i}")
    assert executes(s) == ["t0", "t1"]  # tokens to spare; slots not
    assert acquire(s, "t0")[0] == 200
    fulfil(s, "t0")
    assert "t2" in executes(s)
    assert limits(s)[GROUP]["inUse"] == 2


def test_a_changed_rate_starts_a_full_bucket_and_a_deleted_one_lets_all_go(
    flow_server: RunningServer,
) -> None:
    s = flow_server
    set_rate(s, "1/m")
    for i in range(4):
        create(s, f"t{i}")
    assert executes(s) == ["t0"]
    answer = set_rate(s, "1/m", burst=2)
    assert answer["admitted"] == 2
    r = s.client.post("/ops/limits/delete", json={"group": GROUP})
    assert r.status_code == 200 and r.json()["admitted"] == 1
    assert len(executes(s)) == 4


@pytest.mark.parametrize("rate", ["0/s", "-1", "1/d", "x/s", 2_000_000])
def test_a_bad_rate_is_refused(flow_server: RunningServer, rate: Any) -> None:
    r = flow_server.client.post("/ops/limits/set", json={"group": GROUP, "rate": rate})
    assert r.status_code == 400, r.text
    assert "rate" in r.json()["error"]
    assert limits(flow_server) == {}
