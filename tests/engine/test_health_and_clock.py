"""The bookkeeping behind ``/ready`` and the clock-step metrics, on their own clocks:
an episode of store faults is logged twice however many commits it refuses, and a
step of the wall clock is told from the drift and noise of two clocks read apart."""

from __future__ import annotations

import logging

import pytest

from troth.engine.clock import JUMP_MS, ClockWatch
from troth.engine.health import StoreHealth
from troth.store.faults import StoreFault


class Clocks:
    def __init__(self) -> None:
        self.wall_ms = 1_000_000
        self.mono_s = 10.0

    def wall(self) -> int:
        return self.wall_ms

    def mono(self) -> float:
        return self.mono_s

    def tick(self, seconds: float) -> None:
        self.wall_ms += round(seconds * 1000)
        self.mono_s += seconds


def test_an_episode_is_logged_when_it_starts_and_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    counted: list[str] = []
    now = [0.0]
    health = StoreHealth(counted.append, clock=lambda: now[0])
    full = StoreFault("disk_full", "database or disk is full\nmore lines")
    assert str(full) == (
        "Storage is full: the request was not stored; retry later (database or disk is full)"
    )
    assert health.failed(full) is True
    for _ in range(50):
        assert health.failed(full) is False
    now[0] = 4.0
    answer = health.answer()
    assert answer == {
        "status": "unavailable",
        "reason": "disk_full",
        "error": str(full),
        "seconds": 4.0,
    }
    assert health.committed() is full
    assert health.fault is None and health.committed() is None
    assert counted == ["disk_full"] * 51
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("store refuses writes (disk_full): database or disk is full;")
    assert lines[1] == "store takes writes again after 4.0 s (disk_full; 51 commits refused)"


def test_a_change_of_reason_within_an_episode_is_logged_once() -> None:
    health = StoreHealth()
    assert health.failed(StoreFault("unavailable", "connection refused"))
    assert not health.failed(StoreFault("read_only", "read-only transaction"))
    assert health.fault is not None and health.fault.reason == "read_only"
    assert str(StoreFault("unavailable", "postgres unreachable")) == (
        "Store unavailable: postgres unreachable"
    )


def test_a_step_is_told_from_drift_and_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    clocks = Clocks()
    steps: list[int] = []
    watch = ClockWatch(clocks.wall, clocks.mono, on_jump=steps.append)
    clocks.tick(1.0)
    assert watch.observe() == 0  # both moved alike
    clocks.wall_ms += JUMP_MS  # slewing and noise up to a second: not a step
    assert watch.observe() == 0
    clocks.wall_ms += 3_600_000
    before = clocks.wall_ms
    assert watch.observe() == 3_600_000
    assert watch.stepped_at == before and watch.jumps == 1
    assert watch.observe() == 0  # reported once
    clocks.wall_ms -= 7_200_000
    assert watch.observe() == -7_200_000
    assert watch.stepped_at == before  # only a step forward moves it
    assert steps == [3_600_000, -7_200_000] and watch.last_jump_ms == -7_200_000
    assert [r.getMessage()[:40] for r in caplog.records] == [
        "the wall clock stepped forward by 3600.0",
        "the wall clock stepped back by 7200.0 s;",
    ]
