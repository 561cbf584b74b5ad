"""Steps of the wall clock under a running server (libfaketime on the real process).

The protocol's times are wall-clock milliseconds; the timer follows the wall clock.
A step forward fires within a second what it skipped over — a promise's timeout
(and its listener's ``unblock``), a durable sleep, a lease, the missed occurrences
of a schedule, each once — and reads agree with the messages.  A step back fires
nothing early, and what is due by the new wall clock fires on time.
"""

from __future__ import annotations

import itertools
import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from helpers.faketime import FakedServer, faked_server
from helpers.metrics import metric
from helpers.pg import throwaway_database
from helpers.sse import Stream, stream
from helpers.support import VERSION, running_server
from troth.server.config import Settings

HOUR = 3600
FAR = 10**13
MINUTE_MS = 60_000


def call(server: FakedServer, kind: str, data: dict[str, Any]) -> tuple[int, Any]:
    envelope = {"kind": kind, "head": {"corrId": f"c-{time.monotonic_ns()}", "version": VERSION}}
    r = httpx.post(f"{server.url}/", json={**envelope, "data": data}, timeout=10)
    body = r.json()
    return int(body["head"]["status"]), body["data"]


def ok(server: FakedServer, kind: str, data: dict[str, Any]) -> Any:
    status, body = call(server, kind, data)
    assert status == 200, (kind, status, body)
    return body


def now_ms() -> int:
    return time.time_ns() // 1_000_000  # the test's clock is real time


def messages(s: Stream, seconds: float) -> list[dict[str, Any]]:
    """Every message ``s`` receives within ``seconds``."""
    got: list[dict[str, Any]] = []
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        try:
            got.append(s.next(timeout=left))
        except queue.Empty:
            break
    return got


def about(message: dict[str, Any]) -> tuple[str, str]:
    data = message["data"]
    thing = data.get("promise") or data.get("task")
    return message["kind"], thing["id"]


def occurrences(server: FakedServer, schedule: str) -> list[str]:
    found: list[str] = []
    cursor: str | None = None
    while True:
        data: dict[str, Any] = {"tags": {"resonate:schedule": schedule}, "limit": 100}
        if cursor:
            data["cursor"] = cursor
        page = ok(server, "promise.search", data)
        found += [p["id"] for p in page["promises"]]
        cursor = page.get("cursor")
        if not cursor:
            return found


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakedServer]:
    args = ["--host", "127.0.0.1", "--store", "sqlite", "--db", str(tmp_path / "t.db")]
    with faked_server(tmp_path, [*args, "--log-level", "info"]) as s:
        yield s


def test_a_step_forward_fires_what_it_skipped_over_within_a_second(server: FakedServer) -> None:
    external = {"resonate:external": "true"}
    with stream(server.url, "g", "w1") as w1:
        start = now_ms()
        # A promise that times out in 30 min, a durable sleep of 20 min, each listened to.
        ok(
            server,
            "promise.create",
            {"id": "late", "timeoutAt": start + 30 * MINUTE_MS, "tags": external},
        )
        timer = {"resonate:timer": "true"}
        ok(
            server,
            "promise.create",
            {"id": "nap", "timeoutAt": start + 20 * MINUTE_MS, "tags": timer},
        )
        for id in ("late", "nap"):
            ok(server, "promise.register_listener", {"awaited": id, "address": "poll://uni@g/w1"})
        # A task leased for 30 min.
        target = {"resonate:target": "poll://any@g/w1"}
        ok(
            server,
            "promise.create",
            {"id": "job", "timeoutAt": start + 10 * 60 * MINUTE_MS, "tags": target},
        )
        execute = w1.next()
        assert about(execute) == ("execute", "job")
        version = execute["data"]["task"]["version"]
        lease = {"id": "job", "version": version, "pid": "w1", "ttl": 30 * MINUTE_MS}
        ok(server, "task.acquire", lease)
        # A schedule every 10 minutes (its next run, minutes away, wakes nothing now).
        ok(
            server,
            "schedule.create",
            {
                "id": "tenly",
                "cron": "*/10 * * * *",
                "promiseId": "{{.id}}-{{.timestamp}}",
                "promiseTimeout": 10 * 60 * MINUTE_MS,
            },
        )
        before = occurrences(server, "tenly")
        # Quiet until the timer sleeps for the earliest of those, minutes away (the
        # task's first retry, 5 s after its creation, is past by then).
        assert messages(w1, 6) == []

        server.step(+HOUR)
        stepped = time.monotonic()
        got: set[tuple[str, str]] = set()
        while not {("unblock", "late"), ("unblock", "nap"), ("execute", "job")} <= got:
            left = stepped + 2.5 - time.monotonic()
            assert left > 0, f"only {got} within 2.5 s of the step"
            got.add(about(w1.next(timeout=left)))
        assert time.monotonic() - stepped < 2.5

    # Reads agree with the messages.
    assert ok(server, "promise.get", {"id": "late"})["promise"]["state"] == "rejected_timedout"
    assert ok(server, "promise.get", {"id": "nap"})["promise"]["state"] == "resolved"
    assert ok(server, "task.get", {"id": "job"})["task"]["state"] == "pending"
    # The schedule's missed occurrences, each once, at its own instant (the catch-up
    # rule, docs/protocol.md): six for an hour, not one more as time goes on.
    deadline = time.monotonic() + 5
    while len(occurrences(server, "tenly")) < len(before) + 6:
        assert time.monotonic() < deadline, occurrences(server, "tenly")
        time.sleep(0.2)
    time.sleep(1.5)
    after = occurrences(server, "tenly")
    # Six for the hour skipped; a seventh only when the clock, running on, crossed the
    # next ten-minute mark while the test ran (the consecutive instants below show
    # it is that one, not a repeat).
    assert len(after) == len(set(after)), after
    assert len(after) - len(before) in (6, 7), after
    stamps = sorted(int(id.rsplit("-", 1)[1]) for id in after)
    assert all(b - a == 10 * MINUTE_MS for a, b in itertools.pairwise(stamps))

    assert metric(server.url, "troth_clock_jumps_total") == 1
    assert 3590 <= metric(server.url, "troth_clock_last_jump_seconds") <= 3610
    assert metric(server.url, "troth_timer_lag_seconds") < 5  # a step is not lag
    assert "the wall clock stepped forward by 3600" in server.text()


def test_a_step_back_fires_nothing_early_and_what_is_due_fires_on_time(
    server: FakedServer,
) -> None:
    external = {"resonate:external": "true"}
    with stream(server.url, "g", "w1") as w1:
        start = now_ms()
        due = start + 10_000  # "soon" times out, and the lease of "job" ends, then
        ok(server, "promise.create", {"id": "soon", "timeoutAt": due, "tags": external})
        ok(server, "promise.register_listener", {"awaited": "soon", "address": "poll://uni@g/w1"})
        target = {"resonate:target": "poll://any@g/w1"}
        ok(
            server,
            "promise.create",
            {"id": "job", "timeoutAt": start + 10 * 60 * MINUTE_MS, "tags": target},
        )
        execute = w1.next()
        version = execute["data"]["task"]["version"]
        ttl = due - now_ms()
        ok(server, "task.acquire", {"id": "job", "version": version, "pid": "w1", "ttl": ttl})
        server.step(-HOUR)
        assert now_ms() < due - 3000, "the set-up took too long for the test to mean anything"

        # Due by the new wall clock in 2 s: fires on time, not an hour late.
        time.sleep(1.5)  # the timer notices the step within a second
        back = now_ms() - HOUR * 1000
        ok(server, "promise.create", {"id": "after", "timeoutAt": back + 2000, "tags": external})
        ok(server, "promise.register_listener", {"awaited": "after", "address": "poll://uni@g/w1"})
        created = time.monotonic()
        assert about(w1.next(timeout=5)) == ("unblock", "after")
        assert time.monotonic() - created < 4
        # Nothing fires early: by real time "soon" and the lease are overdue, by the
        # server's wall clock an hour away.
        assert messages(w1, (due - now_ms()) / 1000 + 2) == []
        assert ok(server, "promise.get", {"id": "soon"})["promise"]["state"] == "pending"
        assert ok(server, "task.get", {"id": "job"})["task"]["state"] == "acquired"

        # Back to real time: what is due by it fires within a second.
        server.step(0)
        got = {about(m) for m in messages(w1, 2.5)}
        assert {("unblock", "soon"), ("execute", "job")} <= got, got
    assert metric(server.url, "troth_clock_jumps_total") == 2
    assert "the wall clock stepped back by 3600" in server.text()


def test_a_node_whose_clock_steps_is_not_declared_dead(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Heartbeats and the dead-node check use the database's clock: a step of one
    node's own clock, either way, changes nothing of the cluster's view."""
    with throwaway_database("troth_clock") as url:
        settings = Settings(
            store="postgres", postgres_url=url, node_id="steady", node_timeout=5.0, access_log=False
        )
        with running_server(settings) as steady:
            args = ["--host", "127.0.0.1", "--store", "postgres", "--postgres-url", url]
            args += ["--node-id", "stepping", "--node-timeout", "5", "--log-level", "info"]
            with faked_server(tmp_path, args) as stepping:
                for offset in (+HOUR, -HOUR, 0):
                    stepping.step(offset)
                    # Longer than a node timeout (5 s: not less, on a loaded machine, for a
                    # process slowed by libfaketime reading its file at every clock read).
                    time.sleep(6)
                    with psycopg.connect(url) as conn:
                        live = conn.execute(
                            "SELECT node FROM nodes WHERE seen_at >= "
                            "extract(epoch FROM clock_timestamp()) * 1000 - 5000"
                        ).fetchall()
                    assert sorted(r[0] for r in live) == ["steady", "stepping"], offset
                # Work still flows through the node whose clock stepped.
                status, _ = call(stepping, "promise.create", {"id": "p", "timeoutAt": FAR})
                assert status == 200
                assert steady.ok("promise.get", {"id": "p"})["promise"]["state"] == "pending"
                assert "stopped heartbeating" not in stepping.text()
                assert stepping.text().count("the wall clock stepped") == 3
                # (Checked while both run: once the stepped node stops, it is dead.)
                assert not [r for r in caplog.records if "stopped heartbeating" in r.getMessage()]
