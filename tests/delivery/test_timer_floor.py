"""The timer on PostgreSQL reads the next deadline within bounds: up to a few seconds
ahead, and from a floor (the earliest deadline its last read found, or one committed
or announced since).  A deadline beyond the bounds is found by a later read; one below
the floor, which only a node that crashed before announcing it can leave, by the read
from the bottom every ``FULL_READ_EVERY`` seconds."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from helpers.pg import throwaway_database
from helpers.support import RunningServer, running_server, wait_for
from troth.engine import timer
from troth.server.config import Settings


@pytest.fixture
def node() -> Iterator[tuple[RunningServer, str]]:
    with throwaway_database("troth_floor") as url:
        settings = Settings(store="postgres", postgres_url=url, access_log=False)
        with running_server(settings) as server:
            yield server, url


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def stored(url: str, id: str) -> str:
    """The promise's state as stored (a read would project its timeout)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT state FROM promises WHERE id = %s", (id,)).fetchone()
    assert row is not None
    return str(row[0])


def test_a_deadline_beyond_the_read_window_fires_on_time(node: tuple[RunningServer, str]) -> None:
    server, url = node
    deadline = wall_ms() + int(timer.SHARED_MAX_SLEEP * 1000) + 1500
    tags = {"resonate:external": "true"}
    server.ok("promise.create", {"id": "later", "timeoutAt": deadline, "tags": tags})
    wait_for("'later' timed out", lambda: stored(url, "later") == "rejected_timedout", 15)
    lag = wall_ms() - deadline
    assert 0 <= lag < 1000, f"fired {lag} ms after its deadline"


def test_a_deadline_nobody_announced_below_the_floor_waits_for_the_full_read(
    node: tuple[RunningServer, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As another node would leave it: a promise's timeout moved into the past by a
    commit nobody announced.  Reads from the floor do not see it; the read from the
    bottom does."""
    server, url = node
    monkeypatch.setattr(timer, "FULL_READ_EVERY", 3600.0)
    tags = {"resonate:external": "true"}
    server.ok("promise.create", {"id": "p", "timeoutAt": wall_ms() + 3_600_000, "tags": tags})
    time.sleep(0.3)  # the timer has read: its floor is about now
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE promises SET timeout_at = %s WHERE id = 'p'", (wall_ms() - 60_000,))
    engine = server.app.engine
    assert engine._loop is not None
    engine._loop.call_soon_threadsafe(engine.hint, wall_ms() + 10)  # a read from the floor
    time.sleep(1.0)
    assert stored(url, "p") == "pending"
    monkeypatch.setattr(timer, "FULL_READ_EVERY", 0.0)
    engine._loop.call_soon_threadsafe(engine.hint, wall_ms() + 10)
    wait_for("'p' timed out", lambda: stored(url, "p") == "rejected_timedout", 5)


def test_debug_start_stops_a_timer_asleep_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``debug.start`` wakes the timer to stop now, not when its sleep would have
    ended (up to ``SHARED_MAX_SLEEP`` here, made a minute long)."""
    monkeypatch.setattr(timer, "SHARED_MAX_SLEEP", 60.0)
    with throwaway_database("troth_pause") as url:
        settings = Settings(store="postgres", postgres_url=url, debug=True, access_log=False)
        with running_server(settings) as server:
            engine = server.app.engine
            wait_for("the timer asleep", lambda: engine._target > wall_ms() + 30_000, 10)
            server.ok("debug.start", {})
            wait_for("the timer paused", lambda: engine._target == float("inf"), 2)
