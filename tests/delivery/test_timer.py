"""The deadline timer on the real clock: it sleeps until the
earliest stored deadline, fires with millisecond precision, and a write that arms an
earlier deadline wakes it.  Observed through ``debug.snap`` (what is *stored*), since
every read projects anyway.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from helpers.pg import throwaway_database
from helpers.support import RunningServer, running_server
from troth.server.config import Settings


@pytest.fixture
def clocked() -> Iterator[RunningServer]:
    """A debug server whose timer runs on the wall clock (never paused)."""
    with running_server(
        Settings(store="sqlite", db=":memory:", debug=True, retry_timeout=300, access_log=False)
    ) as server:
        yield server


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def wait_for(check: Callable[[], bool], timeout: float) -> float:
    """Seconds until ``check()`` held; fails after ``timeout``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, "condition never held"
        time.sleep(0.005)
    return time.monotonic() - start


def stored_state(server: RunningServer, id: str) -> str:
    for p in server.snap()["promises"]:
        if p["id"] == id:
            return str(p["state"])
    raise AssertionError(id)


def test_deadline_fires_at_its_instant_not_before(clocked: RunningServer) -> None:
    deadline = wall_ms() + 400
    tags = {"resonate:external": "true"}
    clocked.ok("promise.create", {"id": "p", "timeoutAt": deadline, "tags": tags})
    clocked.ok("promise.register_listener", {"awaited": "p", "address": "poll://uni@g/w"})
    assert stored_state(clocked, "p") == "pending"
    wait_for(lambda: stored_state(clocked, "p") == "rejected_timedout", 3)
    lag = wall_ms() - deadline
    assert lag >= 0
    assert lag < 250, f"fired {lag} ms late"
    assert "p:notify:poll://uni@g/w" in {r["key"] for r in clocked.snap()["outbox"]}


def test_an_earlier_deadline_wakes_a_sleeping_timer(clocked: RunningServer) -> None:
    tags = {"resonate:external": "true"}
    clocked.ok("promise.create", {"id": "late", "timeoutAt": wall_ms() + 60_000, "tags": tags})
    time.sleep(0.1)  # the timer is now asleep until the late deadline
    soon = wall_ms() + 200
    clocked.ok("promise.create", {"id": "soon", "timeoutAt": soon, "tags": tags})
    wait_for(lambda: stored_state(clocked, "soon") == "rejected_timedout", 3)
    assert wall_ms() - soon < 250
    assert stored_state(clocked, "late") == "pending"


def test_retry_timeout_is_configuration(clocked: RunningServer) -> None:
    """retry_timeout = 300 ms: a pending task nobody acquires is re-armed every 300 ms."""
    tags = {"resonate:target": "poll://any@nobody"}
    clocked.ok("promise.create", {"id": "t", "timeoutAt": wall_ms() + 60_000, "tags": tags})

    def retry_at() -> int:
        [task] = clocked.snap()["tasks"]
        return int(task["retryAt"])

    first = retry_at()
    wait_for(lambda: retry_at() > first, 3)
    second = retry_at()
    assert second - first >= 300
    assert second - first < 300 + 250


def test_debug_start_pauses_the_timer(clocked: RunningServer) -> None:
    clocked.ok("debug.start", {})
    tags = {"resonate:external": "true"}
    clocked.ok("promise.create", {"id": "p", "timeoutAt": wall_ms() + 100, "tags": tags})
    time.sleep(0.4)
    assert stored_state(clocked, "p") == "pending"
    clocked.ok("debug.stop", {})
    wait_for(lambda: stored_state(clocked, "p") == "rejected_timedout", 3)


def test_a_failing_deadline_announcement_does_not_stop_the_writer(clocked: RunningServer) -> None:
    """``on_deadline`` (the cluster's NOTIFY to other nodes) may fail — the database
    just went away — after the commit: the request is answered and the writer goes
    on serving."""
    calls: list[int] = []

    def failing(deadline: int) -> None:
        calls.append(deadline)
        raise RuntimeError("database went away")

    clocked.app.engine.on_deadline = failing
    tags = {"resonate:timer": "true"}
    deadline = wall_ms() + 600_000
    clocked.ok("promise.create", {"id": "t1", "timeoutAt": deadline, "tags": tags})
    # Announced on the writer thread after the answer was handed to the event loop:
    # the client may hear back first (seen under load in CI).
    wait_for(lambda: calls == [deadline], 5)
    clocked.ok("promise.create", {"id": "t2", "timeoutAt": deadline + 1, "tags": tags})
    assert clocked.app.engine._thread is not None and clocked.app.engine._thread.is_alive()


def test_a_deadline_committed_while_the_timer_reads_is_not_lost() -> None:
    """On PostgreSQL the timer reads the next deadline on a session of its own, while
    the writer goes on committing.  A deadline committed after that read began, and
    later than the target the timer had, is noted and fired on time: the read's stale
    answer (nothing armed) would otherwise put the timer to sleep until it looks again
    (``SHARED_MAX_SLEEP``, 5 s)."""
    with throwaway_database("troth_timer") as url:
        settings = Settings(store="postgres", postgres_url=url, debug=True, access_log=False)
        with running_server(settings) as server:
            engine = server.app.engine
            store = server.app.engine.store
            assert store.deadline_apart
            real = store.next_deadline
            read, release = threading.Event(), threading.Event()

            def stale(within: tuple[int, int] | None = None) -> int | None:
                answer = real(within)
                if not read.is_set():
                    read.set()
                    release.wait(10)
                return answer

            store.next_deadline = stale  # type: ignore[method-assign]
            assert engine._loop is not None
            engine._loop.call_soon_threadsafe(engine.hint, 0)  # wake it: it reads now
            assert read.wait(5), "the timer never read the next deadline"
            deadline = wall_ms() + 300
            tags = {"resonate:external": "true"}
            server.ok("promise.create", {"id": "p", "timeoutAt": deadline, "tags": tags})
            release.set()  # the read answers what it saw: no deadline armed
            wait_for(lambda: stored_state(server, "p") == "rejected_timedout", 10)
            lag = wall_ms() - deadline
            assert lag < 1500, f"fired {lag} ms late: the deadline was not noted"


def test_a_pass_paused_while_it_read_the_deadline_fires_nothing(clocked: RunningServer) -> None:
    """``debug.start`` pauses the timer: a pass that was reading the next deadline
    when it came must not fire what was created since by the wall clock (a script on
    debug time, its promise due at 21000 ms after the epoch, would time out at once)."""
    engine = clocked.app.engine
    store = engine.store
    read = store.next_deadline
    reads: list[object] = []

    def pausing(*args: object) -> object:
        engine.pause()  # as debug.start while the pass reads
        found = read(*args)  # type: ignore[arg-type]
        reads.append(found)
        return found

    store.next_deadline = pausing  # type: ignore[method-assign]
    tags = {"resonate:external": "true"}
    clocked.ok("promise.create", {"id": "c", "timeoutAt": 21_000, "tags": tags}, now=1_000)
    wait_for(lambda: 21_000 in reads, 5)  # the pass read the promise's deadline
    wait_for(lambda: engine._target == float("inf"), 5)  # and went back to its wait
    assert stored_state(clocked, "c") == "pending"
    clocked.ok("debug.tick", {"time": 21_000}, now=21_000)  # debug time still fires it
    assert stored_state(clocked, "c") == "rejected_timedout"
