"""A task that keeps bouncing backs off (docs/protocol.md, "Tasks that keep bouncing
back off").

A worker that takes a task and gives it back without progress (``task.release``
answered 200) bounces it; the specification's release re-pends the task at once and
r6 re-emits its ``execute`` in the same commit.  From the third bounce of an episode
the server holds that ``execute`` row back (``availableAt`` past its ``createdAt``) by
50 ms × 2^k, at most ``retryTimeout``; the machine's records are the specification's
(the task is pending with ``retryAt = now + retryTimeout``).  Progress (a suspend or a
fulfil) ends the episode; a worker connecting to the task's group makes the held row
due at once.  On every backend, at debug time, with the loops paused (the rows stay
pending for ``debug.snap`` to show).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from helpers.sse import stream
from helpers.support import RunningServer
from helpers.wire import EXT, RETRY, TGT, action

NOW = 1000
FAR = 10**12


def delay_of(bounce: int) -> int:
    """The hold the ``bounce``-th bounce of an episode puts on its execute row."""
    return 0 if bounce < 3 else min(50 << (bounce - 3), RETRY)


def create(server: RunningServer, id: str = "wf", tags: dict[str, str] = TGT) -> None:
    server.ok("promise.create", {"id": id, "timeoutAt": FAR, "tags": tags}, NOW)


def acquire(server: RunningServer, at: int, id: str = "wf") -> int:
    version = server.outbox()[id]["message"]["version"]
    body = server.ok("task.acquire", {"id": id, "version": version, "pid": "w1", "ttl": 60_000}, at)
    assert body["task"]["state"] == "acquired"
    v: int = body["task"]["version"]
    return v


def bounce(server: RunningServer, at: int, id: str = "wf") -> dict[str, Any]:
    """Acquire and release at ``at``; the execute row the release wrote."""
    version = acquire(server, at, id)
    assert server.ok("task.release", {"id": id, "version": version}, at) == {}
    row: dict[str, Any] = server.outbox()[id]
    assert row["createdAt"] == at
    return row


def held(row: dict[str, Any]) -> int:
    return int(row["availableAt"]) - int(row["createdAt"])


def test_a_task_released_again_and_again_has_its_execute_held_back(
    server: RunningServer,
) -> None:
    create(server)
    assert held(server.outbox()["wf"]) == 0  # the first offer: at once
    at = NOW
    seen = []
    for _ in range(1, 12):
        at += 1
        row = bounce(server, at)
        seen.append(held(row))
        assert row["attempts"] == 0 and row["state"] == "pending"
        # The machine is untouched: pending, re-armed by r6 at now + retryTimeout, so
        # the held row (at most retryTimeout) is due no later than the next r6.
        task = next(t for t in server.snap()["tasks"] if t["id"] == "wf")
        assert task["state"] == "pending" and task["retryAt"] == at + RETRY
    assert seen == [delay_of(n) for n in range(1, 12)]
    assert seen[:5] == [0, 0, 50, 100, 200] and seen[-1] == RETRY


def test_progress_ends_the_episode(server: RunningServer) -> None:
    """A suspend answered 200 is progress: the task is re-offered at once when its
    awaited promise settles, and its next bounce counts from one again."""
    create(server)
    create(server, "ext", EXT)
    for at in range(NOW + 1, NOW + 5):
        row = bounce(server, at)
    assert held(row) == delay_of(4) > 0

    version = acquire(server, NOW + 10)
    awaited = action("promise.register_callback", {"awaited": "ext", "awaiter": "wf"})
    suspend = {"id": "wf", "version": version, "actions": [awaited]}
    assert server.call("task.suspend", suspend, NOW + 10) == (200, {})
    server.ok("promise.settle", {"id": "ext", "state": "resolved", "value": {}}, NOW + 20)
    assert held(server.outbox()["wf"]) == 0  # woken: offered at once

    assert held(bounce(server, NOW + 30)) == 0
    assert held(bounce(server, NOW + 31)) == 0
    assert held(bounce(server, NOW + 32)) == 50


def test_a_refused_suspend_is_not_progress(server: RunningServer) -> None:
    """The TypeScript SDK's spin: suspend refused, release, again."""
    create(server)
    create(server, "internal", {})  # not external: a suspend awaiting it is refused
    for n, at in enumerate(range(NOW + 1, NOW + 5), start=1):
        version = acquire(server, at)
        awaited = action("promise.register_callback", {"awaited": "internal", "awaiter": "wf"})
        suspend = {"id": "wf", "version": version, "actions": [awaited]}
        assert server.call("task.suspend", suspend, at)[0] == 422
        server.ok("task.release", {"id": "wf", "version": version}, at)
        assert held(server.outbox()["wf"]) == delay_of(n)


def test_a_bounce_long_after_the_last_re_offer_starts_a_new_episode(
    server: RunningServer,
) -> None:
    create(server)
    for at in range(NOW + 1, NOW + 4):
        row = bounce(server, at)
    assert held(row) == 50
    # Re-offered at NOW + 53; the window (10 s) counts from there.
    assert held(bounce(server, NOW + 53 + 10_000)) == 100  # still the same episode
    assert held(bounce(server, NOW + 53 + 10_100 + 10_001)) == 0  # a new one


def wait_until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_worker_connecting_to_the_group_makes_the_held_execute_due(
    server: RunningServer,
) -> None:
    create(server)
    create(server, "other", {"resonate:target": "poll://any@elsewhere"})
    for at in range(NOW + 1, NOW + 6):
        row = bounce(server, at)
    assert held(row) == 200
    with stream(server, "unrelated", "w0"):
        time.sleep(0.3)  # a worker of another group changes nothing
        assert held(server.outbox()["wf"]) == 200
    with stream(server, "workers", "w2"):
        wait_until(lambda: held(server.outbox()["wf"]) == 0)
    row = server.outbox()["wf"]
    assert row["attempts"] == 0 and row["state"] == "pending"
    assert row["message"]["kind"] == "execute"
    # The episode goes on: a worker that also lacks the function backs off again.
    assert held(bounce(server, NOW + 10)) == 400


def test_the_backoff_is_logged_once_per_episode_with_the_last_refusal(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = server.app.metrics
    bounces = metrics.value("troth_task_bounces_total")
    backoffs = metrics.value("troth_task_backoffs_total")
    create(server)
    version = acquire(server, NOW + 1)
    done = {"id": "wf", "state": "resolved", "value": {}}
    fulfil = {"id": "wf", "version": version + 7, "action": action("promise.settle", done)}
    status, message = server.call("task.fulfill", fulfil, NOW + 1)
    assert status == 409, message
    server.ok("task.release", {"id": "wf", "version": version}, NOW + 1)
    with caplog.at_level(logging.WARNING, logger="troth.bounces"):
        for at in range(NOW + 2, NOW + 7):
            bounce(server, at)
    lines = [r.getMessage() for r in caplog.records if r.name == "troth.bounces"]
    assert len(lines) == 1, lines
    assert lines[0].startswith("task wf bounced 3 times in 0.0 s without progress (group workers)")
    assert "last refusal: task.fulfill 409 " in lines[0] and "corrId=t-" in lines[0]
    assert metrics.value("troth_task_bounces_total") - bounces == 6
    assert metrics.value("troth_task_backoffs_total") - backoffs == 4
    assert "troth_tasks_in_backoff" in server.client.get("/metrics").text
