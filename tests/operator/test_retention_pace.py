"""How the retention loop paces itself (server/operator/retention.py, ``RetentionLoop.pace``):
while requests are being served it takes at most a fifth of the writer, in batches
sized toward a short hold; when none came since its last batch it goes on at once
with full batches; it says in the log when it falls far behind; and it gives free
pages back after a pass in steps paced the same way."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any, cast

import pytest

from troth.engine import Engine
from troth.server.metrics import Metrics
from troth.server.operator.retention import (
    BETWEEN_BATCHES,
    FIRST,
    RECLAIM_MOST,
    SHARE,
    SPARE,
    TARGET,
    RetentionLoop,
)


def loop(batch: int = 100) -> tuple[RetentionLoop, Any]:
    engine = SimpleNamespace(stats=SimpleNamespace(jobs=0))
    made = RetentionLoop(cast(Engine, engine), 60_000, batch=batch, interval=1.0, metrics=Metrics())
    return made, engine


def test_idle_goes_on_at_once_with_full_batches() -> None:
    r, _ = loop()
    r.roots, r.held = 3, 0.5
    assert r.pace() == 0.0
    assert r.roots == 100


def test_busy_keeps_to_its_share_and_shrinks_a_long_batch() -> None:
    r, engine = loop()
    assert r.roots == FIRST  # a first batch under load holds the writer briefly
    r.roots = 100
    engine.stats.jobs = 10  # requests ran since the last batch
    r.held = 4 * TARGET
    pause = r.pace()
    assert pause == pytest.approx(r.held * (1 - SHARE) / SHARE)
    assert r.held / (r.held + pause) == pytest.approx(SHARE)
    assert r.roots == 25  # a quarter: toward TARGET
    engine.stats.jobs = 20
    r.held = TARGET / 10  # short batches grow back, never past retention_batch
    assert r.pace() == BETWEEN_BATCHES
    assert r.roots == 50
    for _ in range(5):
        engine.stats.jobs += 1
        r.pace()
    assert r.roots == 100


def test_far_behind_under_load_is_logged_once_a_while(caplog: pytest.LogCaptureFixture) -> None:
    r, engine = loop()
    r.behind_ms = 3_600_000
    r.held = TARGET
    with caplog.at_level(logging.WARNING, logger="troth.retention"):
        engine.stats.jobs = 1
        r.pace()
        engine.stats.jobs = 2
        r.pace()
    lines = [m for m in caplog.messages if "retention is 3600 s behind" in m]
    assert len(lines) == 1


def test_giving_pages_back_goes_in_paced_steps_to_the_spare(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a pass: free pages are given back a step at a time, each step sized as a
    batch is (growing while short, under load), down to the spare; idle, in steps as
    large as RECLAIM_MOST."""
    asked: list[int] = []
    free = {"left": 1000}

    def reclaim(pages: int, spare: float) -> int:
        assert spare == SPARE
        asked.append(pages)
        free["left"] = max(0, free["left"] - pages)
        return free["left"]

    jobs = {"n": 0}

    async def exclusive(fn: Any, *, here: bool = False, inside: Any = None) -> Any:
        assert here and inside is not None
        jobs["n"] += 1  # requests keep coming between steps: busy
        engine.stats.jobs = jobs["n"]
        return fn()

    engine = SimpleNamespace(
        stats=SimpleNamespace(jobs=0),
        store=SimpleNamespace(reclaim=reclaim, reclaim_open=reclaim),
        exclusive=exclusive,
    )
    r = RetentionLoop(cast(Engine, engine), 60_000, batch=100, interval=1.0, metrics=Metrics())
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    monkeypatch.setattr("troth.server.operator.retention.asyncio.sleep", sleep)
    asyncio.run(r._reclaim())
    assert asked[:4] == [64, 128, 256, 512]  # short steps grow, never all at once
    assert free["left"] == 0
    assert pauses and all(p >= BETWEEN_BATCHES for p in pauses)
    asked.clear()
    free["left"] = 5000
    engine.exclusive = lambda fn, **_: _now(fn())  # idle: no request between steps
    asyncio.run(r._reclaim())
    assert asked[1:] == [RECLAIM_MOST] * (len(asked) - 1)


async def _now(value: Any) -> Any:
    return value
