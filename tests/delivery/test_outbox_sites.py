"""Every enqueue site of seed 004's two tables, one test each (plus the non-sites).

Seed 004 was written against an older spec that wrote outbox rows inside the
handlers.  The current spec (SPEC.md §5) only marks the task ``pending`` with a
``retryAt`` and lets the internal steps send: r6 sends ``execute``, r3 sends
``unblock``, r4 resumes awaiters.  troth fires every enabled internal step at once,
inside the transaction of the request that enabled it (reference README), and the
deadline-driven ones (promise timeout, lease expiry, retry, schedule) from the timer
— here from ``debug.tick``.  So each site must show its row right after the request
(or the tick), with the exact key, address, message and version, and
``createdAt`` = the instant of that request.

Outbox keys (seed 004 ``OutboxEntry.key``, SPEC.md §2.1): execute → the task id;
unblock → ``{promiseId}:notify:{address}``.
"""

from __future__ import annotations

from typing import Any

from helpers.support import RunningServer
from helpers.wire import EXT, RETRY, TGT, action, execute, rc, rows, stored_task


def create(
    server: RunningServer,
    id: str,
    now: int,
    tags: dict[str, str] | None = None,
    timeout_at: int = 100_000,
) -> dict[str, Any]:
    body = {"id": id, "timeoutAt": timeout_at, "tags": tags if tags is not None else {}}
    promise: dict[str, Any] = server.ok("promise.create", body, now)["promise"]
    return promise


def task_create(
    server: RunningServer,
    id: str,
    now: int,
    *,
    tags: dict[str, str] | None = None,
    timeout_at: int = 100_000,
    ttl: int = 60_000,
) -> None:
    inner = {"id": id, "timeoutAt": timeout_at, "tags": tags if tags is not None else TGT}
    server.ok(
        "task.create", {"pid": "w1", "ttl": ttl, "action": action("promise.create", inner)}, now
    )


def suspend(server: RunningServer, id: str, version: int, awaited: list[str], now: int) -> None:
    body = {"id": id, "version": version, "actions": [rc(a, id) for a in awaited]}
    assert server.call("task.suspend", body, now) == (200, {})


def unblock(promise: dict[str, Any], address: str, created_at: int) -> dict[str, Any]:
    key = f"{promise['id']}:notify:{address}"
    return {
        "key": key,
        "address": address,
        "message": {"kind": "unblock", "promise": promise},
        "createdAt": created_at,
    }


def settled(
    id: str,
    state: str,
    created_at: int,
    settled_at: int,
    *,
    tags: dict[str, str],
    timeout_at: int = 100_000,
    value: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": id,
        "state": state,
        "param": {},
        "value": value or {},
        "tags": tags,
        "timeoutAt": timeout_at,
        "createdAt": created_at,
        "settledAt": settled_at,
    }


# ------------------------------------------------------------------ execute messages


def test_execute_on_promise_create_with_target(server: RunningServer) -> None:
    """Seed 004 row 1 (promiseCreate): a targeted promise is dispatched at once, at
    version 0, to the target address; the retry is armed at now + retryTimeout."""
    create(server, "a", 1000, TGT)
    assert rows(server) == {"a": execute("a", 0, 1000)}
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "pending",
        "version": 0,
        "retryAt": 1000 + RETRY,
        "resumes": [],
    }


def test_no_execute_for_untargeted_promise(server: RunningServer) -> None:
    """Only ``resonate:target`` makes a task; external or plain promises send nothing."""
    create(server, "a", 1000, EXT)
    create(server, "b", 1000, {"resonate:timer": "true"})
    create(server, "c", 1000)
    assert server.snap()["outbox"] == []


def test_execute_waits_for_future_delay(server: RunningServer) -> None:
    """Seed 004 "one enqueue site that does not send": a future ``resonate:delay``
    sends nothing until the tick at the delay instant (§10.8)."""
    create(server, "a", 1000, {**TGT, "resonate:delay": "4000"})
    assert server.snap()["outbox"] == []
    server.tick(3999)
    assert server.snap()["outbox"] == []
    server.tick(4000)
    assert rows(server) == {"a": execute("a", 0, 4000)}
    assert stored_task(server, "a")["retryAt"] == 4000 + RETRY


def test_execute_at_once_for_elapsed_delay(server: RunningServer) -> None:
    """Seed 004 row 1, "or elapsed delay": a delay at or before now dispatches at once."""
    create(server, "a", 1000, {**TGT, "resonate:delay": "1000"})
    create(server, "b", 1000, {**TGT, "resonate:delay": "10"})
    assert rows(server) == {"a": execute("a", 0, 1000), "b": execute("b", 0, 1000)}


def test_no_execute_on_task_create(server: RunningServer) -> None:
    """Seed 004: task.create makes the task ``acquired`` (the caller holds it) and
    writes no execute, live or born dead."""
    task_create(server, "a", 1000)
    task_create(server, "b", 1000, timeout_at=500)
    assert server.snap()["outbox"] == []


def test_execute_on_task_release(server: RunningServer) -> None:
    """Seed 004 row 2 (taskRelease): release → pending, execute at the current version."""
    task_create(server, "a", 1000)
    server.ok("task.release", {"id": "a", "version": 1}, 2000)
    assert rows(server) == {"a": execute("a", 1, 2000)}
    assert stored_task(server, "a")["retryAt"] == 2000 + RETRY


def test_execute_on_task_continue(server: RunningServer) -> None:
    """Seed 004 row 3 (taskContinue): halt sends nothing, continue sends execute."""
    task_create(server, "a", 1000)
    server.ok("task.halt", {"id": "a"}, 1500)
    assert server.snap()["outbox"] == []
    server.ok("task.continue", {"id": "a"}, 2000)
    assert rows(server) == {"a": execute("a", 1, 2000)}


def test_execute_on_retry_timeout(server: RunningServer) -> None:
    """Seed 004 row 4 (onTaskRetryTimeout, r6): at retryAt the execute is re-emitted
    and re-armed; the row is upserted, so there is still one row for the task key."""
    create(server, "a", 1000, TGT)
    server.tick(5999)
    assert rows(server) == {"a": execute("a", 0, 1000)}
    server.tick(6000)
    assert rows(server) == {"a": execute("a", 0, 6000)}
    server.tick(11_000)
    assert rows(server) == {"a": execute("a", 0, 11_000)}
    assert [r["key"] for r in server.snap()["outbox"]] == ["a"]
    assert stored_task(server, "a")["retryAt"] == 11_000 + RETRY


def test_no_retry_after_acquire(server: RunningServer) -> None:
    """Acquisition clears retryAt: the retry step no longer fires for the task."""
    create(server, "a", 1000, TGT)
    server.ok("task.acquire", {"id": "a", "version": 0, "pid": "w", "ttl": 60_000}, 2000)
    server.tick(6000)
    assert rows(server) == {"a": execute("a", 0, 1000)}


def test_execute_on_lease_expiry(server: RunningServer) -> None:
    """Seed 004 row 5 (onTaskLeaseTimeout, r5 then r6): at expiresAt the task goes
    back to pending and an execute at the same version is sent."""
    task_create(server, "a", 1000, ttl=500)
    server.tick(1499)
    assert server.snap()["outbox"] == []
    server.tick(1500)
    assert rows(server) == {"a": execute("a", 1, 1500)}
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "pending",
        "version": 1,
        "retryAt": 1500 + RETRY,
        "resumes": [],
    }


# ------------------------------------------------------------------ the resume chain


def test_resume_suspended_awaiter_sends_execute(server: RunningServer) -> None:
    """Seed 004 row 6 (enqueueResume, r4): the awaited settles, the suspended awaiter
    goes pending with resumes = [awaited] and an execute at its unchanged version."""
    task_create(server, "a", 1000)
    create(server, "b", 1000, EXT)
    suspend(server, "a", 1, ["b"], 1500)
    server.ok("promise.settle", {"id": "b", "state": "resolved"}, 2000)
    assert rows(server) == {"a": execute("a", 1, 2000)}
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "pending",
        "version": 1,
        "retryAt": 2000 + RETRY,
        "resumes": ["b"],
    }


def test_second_settlement_buffers_into_woken_task(server: RunningServer) -> None:
    """r4 on an awaiter already woken (now pending) only appends to resumes: the
    execute row of the first wake is left as it was."""
    task_create(server, "a", 1000)
    create(server, "b", 1000, EXT)
    create(server, "c", 1000, EXT)
    suspend(server, "a", 1, ["b", "c"], 1000)
    server.ok("promise.settle", {"id": "b", "state": "resolved"}, 2000)
    server.ok("promise.settle", {"id": "c", "state": "resolved"}, 2500)
    assert rows(server) == {"a": execute("a", 1, 2000)}
    assert stored_task(server, "a")["resumes"] == ["b", "c"]
    assert [p["callbacks"] for p in server.snap()["promises"]] == [[], [], []]


def test_stale_callback_wakes_resuspended_task(server: RunningServer) -> None:
    """SPEC §9: the current spec has no "settlement scrub", so a callback left on an
    awaited promise from an earlier suspension still wakes the task when it settles,
    even after the task was re-acquired and suspended on something else."""
    task_create(server, "a", 1000)
    for id in ("b", "c", "d"):
        create(server, id, 1000, EXT)
    suspend(server, "a", 1, ["b", "c"], 1000)
    server.ok("promise.settle", {"id": "b", "state": "resolved"}, 2000)
    server.ok("task.acquire", {"id": "a", "version": 1, "pid": "w", "ttl": 60_000}, 2100)
    suspend(server, "a", 2, ["d"], 2200)
    server.ok("promise.settle", {"id": "c", "state": "resolved"}, 3000)
    assert rows(server) == {"a": execute("a", 2, 3000)}
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "pending",
        "version": 2,
        "retryAt": 3000 + RETRY,
        "resumes": ["c"],
    }


def test_halt_stops_redispatch(server: RunningServer) -> None:
    """Halting a pending task clears retryAt: no re-dispatch until continue."""
    create(server, "a", 1000, TGT)
    server.ok("task.halt", {"id": "a"}, 2000)
    server.tick(6000)
    server.tick(11_000)
    assert rows(server) == {"a": execute("a", 0, 1000)}
    server.ok("task.continue", {"id": "a"}, 12_000)
    assert rows(server) == {"a": execute("a", 0, 12_000)}


def test_resume_pending_awaiter_buffers(server: RunningServer) -> None:
    """Seed 004: a pending awaiter buffers the awaited id and sends nothing new
    (its execute row from birth is left as it was)."""
    create(server, "a", 1000, TGT)
    create(server, "b", 1000, EXT)
    server.ok("promise.register_callback", {"awaited": "b", "awaiter": "a"}, 1000)
    server.ok("promise.settle", {"id": "b", "state": "resolved"}, 2000)
    assert rows(server) == {"a": execute("a", 0, 1000)}
    assert stored_task(server, "a")["resumes"] == ["b"]
    assert stored_task(server, "a")["retryAt"] == 1000 + RETRY


def test_resume_acquired_awaiter_buffers(server: RunningServer) -> None:
    """Seed 004: an acquired awaiter buffers, no execute."""
    task_create(server, "a", 1000)
    create(server, "b", 1000, EXT)
    create(server, "c", 1000, EXT)
    for awaited in ("b", "c"):
        server.ok("promise.register_callback", {"awaited": awaited, "awaiter": "a"}, 1000)
    server.ok("promise.settle", {"id": "c", "state": "resolved"}, 2000)
    server.ok("promise.settle", {"id": "b", "state": "rejected"}, 2100)
    assert server.snap()["outbox"] == []
    assert stored_task(server, "a")["resumes"] == ["c", "b"]
    assert stored_task(server, "a")["state"] == "acquired"


def test_resume_halted_awaiter_buffers(server: RunningServer) -> None:
    """Seed 004: a halted awaiter buffers, stays halted, no execute."""
    task_create(server, "a", 1000)
    create(server, "b", 1000, EXT)
    suspend(server, "a", 1, ["b"], 1000)
    server.ok("task.halt", {"id": "a"}, 1500)
    server.ok("promise.settle", {"id": "b", "state": "resolved"}, 2000)
    assert server.snap()["outbox"] == []
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "halted",
        "version": 1,
        "resumes": ["b"],
    }


def test_resume_fulfilled_awaiter_is_noop(server: RunningServer) -> None:
    """Seed 004: a fulfilled awaiter is a no-op (the callback is still drained)."""
    task_create(server, "a", 1000)
    create(server, "b", 1000, EXT)
    suspend(server, "a", 1, ["b"], 1000)
    server.ok("promise.settle", {"id": "a", "state": "resolved"}, 1500)
    server.ok("promise.settle", {"id": "b", "state": "resolved"}, 2000)
    assert server.snap()["outbox"] == []
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "fulfilled",
        "version": 1,
        "resumes": [],
    }
    assert [p["callbacks"] for p in server.snap()["promises"] if p["id"] == "b"] == [[]]


def test_resume_dead_awaiter_is_dropped(server: RunningServer) -> None:
    """SPEC §10.15 (C6): an awaiter past its own deadline is fulfilled, not resumed."""
    task_create(server, "a", 1000, timeout_at=1800)
    create(server, "b", 1000, EXT)
    suspend(server, "a", 1, ["b"], 1000)
    server.ok("promise.settle", {"id": "b", "state": "resolved"}, 2000)
    assert server.snap()["outbox"] == []
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "fulfilled",
        "version": 1,
        "resumes": [],
    }


def test_empty_target_sends_execute_to_empty_address(server: RunningServer) -> None:
    """CURRENT spec, not seed 004.  Seed 004 (older ``enqueueResume``) says "Empty
    target sends nothing"; the current spec's r6 (SPEC.md §5) sends ``execute`` to the
    value of ``resonate:target`` or "", and lists ``resonate:target = ""`` as an
    accepted known gap (§6.3).  So an awaiter whose target is "" is re-pended by the
    resume AND an execute is written to address "" — as is the birth dispatch."""
    empty = {"resonate:target": ""}
    create(server, "p", 1000, empty)
    assert rows(server) == {"p": execute("p", 0, 1000, address="")}
    task_create(server, "a", 1000, tags=empty)
    create(server, "b", 1000, EXT)
    suspend(server, "a", 1, ["b"], 1000)
    server.ok("promise.settle", {"id": "b", "state": "resolved"}, 2000)
    assert rows(server) == {
        "p": execute("p", 0, 1000, address=""),
        "a": execute("a", 1, 2000, address=""),
    }
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "pending",
        "version": 1,
        "retryAt": 2000 + RETRY,
        "resumes": ["b"],
    }


def test_fence_settle_wakes_suspended_awaiter(server: RunningServer) -> None:
    """task.fence delegates to the full promiseSettle (seed 004): fence-settling an
    awaited promise wakes its suspended awaiter and unblocks its listener, in the
    fence's own transaction."""
    task_create(server, "a", 1000)
    task_create(server, "f", 1000)
    create(server, "b", 1000, EXT)
    suspend(server, "a", 1, ["b"], 1000)
    server.ok("promise.register_listener", {"awaited": "b", "address": "http://l"}, 1000)
    fence = action("promise.settle", {"id": "b", "state": "resolved", "value": {"data": "v"}})
    out = server.ok("task.fence", {"id": "f", "version": 1, "action": fence}, 2000)
    record = settled("b", "resolved", 1000, 2000, tags=EXT, value={"data": "v"})
    assert out["action"]["data"] == {"promise": record}
    assert rows(server) == {
        "a": execute("a", 1, 2000),
        "b:notify:http://l": unblock(record, "http://l", 2000),
    }


def test_fence_create_with_target_sends_execute(server: RunningServer) -> None:
    """task.fence delegates to the full promiseCreate (seed 004): an inner create of
    a targeted promise dispatches it at version 0."""
    task_create(server, "f", 1000)
    inner = action("promise.create", {"id": "c", "timeoutAt": 100_000, "tags": TGT})
    server.ok("task.fence", {"id": "f", "version": 1, "action": inner}, 2000)
    assert rows(server) == {"c": execute("c", 0, 2000)}


def test_schedule_occurrence_with_target_sends_execute(server: RunningServer) -> None:
    """onScheduleTimeout's catch-up calls promiseCreate (seed 004): a targeted
    occurrence is dispatched by the tick that creates it."""
    sched = {
        "id": "s",
        "cron": "*/10 * * * * *",
        "promiseId": "{{.timestamp}}",
        "promiseTimeout": 60_000,
        "promiseTags": TGT,
    }
    server.ok("schedule.create", sched, 1000)
    server.tick(10_000)
    assert rows(server) == {"~s/10000": execute("~s/10000", 0, 10_000)}


# ------------------------------------------------------------------ unblock messages


def test_unblock_on_promise_settle(server: RunningServer) -> None:
    """Seed 004 unblock row 1 (promiseSettle): one unblock per listener carrying the
    full settled record; the listener ledger is drained."""
    create(server, "p", 1000, EXT)
    for address in ("http://a", "https://b", "poll://any@g"):
        server.ok("promise.register_listener", {"awaited": "p", "address": address}, 1000)
    server.ok("promise.register_listener", {"awaited": "p", "address": "http://a"}, 1100)
    body = {"id": "p", "state": "rejected", "value": {"headers": {"h": "1"}, "data": "e"}}
    server.ok("promise.settle", body, 2000)
    record = settled(
        "p", "rejected", 1000, 2000, tags=EXT, value={"headers": {"h": "1"}, "data": "e"}
    )
    assert rows(server) == {
        "p:notify:http://a": unblock(record, "http://a", 2000),
        "p:notify:https://b": unblock(record, "https://b", 2000),
        "p:notify:poll://any@g": unblock(record, "poll://any@g", 2000),
    }
    assert [p["listeners"] for p in server.snap()["promises"]] == [[]]


def test_unblock_on_task_fulfill(server: RunningServer) -> None:
    """Seed 004 unblock row 2 (taskFulfill): "miss the task.fulfill path and a promise
    settled through T-07 notifies no one"."""
    task_create(server, "a", 1000)
    server.ok("promise.register_listener", {"awaited": "a", "address": "http://l"}, 1000)
    fulfil = action("promise.settle", {"id": "a", "state": "resolved", "value": {"data": "ok"}})
    server.ok("task.fulfill", {"id": "a", "version": 1, "action": fulfil}, 2000)
    record = settled("a", "resolved", 1000, 2000, tags=TGT, value={"data": "ok"})
    assert rows(server) == {"a:notify:http://l": unblock(record, "http://l", 2000)}


def test_unblock_on_promise_timeout(server: RunningServer) -> None:
    """Seed 004 unblock row 3 (onPromiseTimeout, r1 then r3): nothing before the
    deadline; the tick at timeoutAt sends the timed-out record (settledAt = timeoutAt,
    empty value)."""
    create(server, "p", 1000, EXT, timeout_at=3000)
    server.ok("promise.register_listener", {"awaited": "p", "address": "http://l"}, 1000)
    server.tick(2999)
    assert server.snap()["outbox"] == []
    server.tick(3000)
    record = settled("p", "rejected_timedout", 1000, 3000, tags=EXT, timeout_at=3000)
    assert rows(server) == {"p:notify:http://l": unblock(record, "http://l", 3000)}


def test_unblock_on_timer_timeout_resolves(server: RunningServer) -> None:
    """r1 for a timer promise: the unblock carries ``resolved``, not a rejection."""
    timer = {"resonate:timer": "true"}
    create(server, "t", 1000, timer, timeout_at=3000)
    server.ok("promise.register_listener", {"awaited": "t", "address": "http://l"}, 1000)
    server.tick(3000)
    record = settled("t", "resolved", 1000, 3000, tags=timer, timeout_at=3000)
    assert rows(server) == {"t:notify:http://l": unblock(record, "http://l", 3000)}


def test_timeout_resumes_suspended_awaiter(server: RunningServer) -> None:
    """Seed 004: every settlement path (here the deadline) also resumes awaiters."""
    task_create(server, "a", 1000)
    create(server, "b", 1000, EXT, timeout_at=3000)
    suspend(server, "a", 1, ["b"], 1000)
    server.tick(3000)
    assert rows(server) == {"a": execute("a", 1, 3000)}
    assert stored_task(server, "a")["resumes"] == ["b"]


def test_unblock_and_resume_together(server: RunningServer) -> None:
    """One settlement drains both ledgers: unblocks for listeners and executes for
    suspended awaiters, all in the settle's transaction."""
    task_create(server, "a1", 1000)
    task_create(server, "a2", 1000, tags={"resonate:target": "http://other"})
    create(server, "b", 1000, EXT)
    suspend(server, "a1", 1, ["b"], 1000)
    suspend(server, "a2", 1, ["b"], 1000)
    server.ok("promise.register_listener", {"awaited": "b", "address": "http://l"}, 1000)
    server.ok("promise.settle", {"id": "b", "state": "resolved"}, 2000)
    record = settled("b", "resolved", 1000, 2000, tags=EXT)
    assert rows(server) == {
        "a1": execute("a1", 1, 2000),
        "a2": execute("a2", 1, 2000, address="http://other"),
        "b:notify:http://l": unblock(record, "http://l", 2000),
    }


def test_no_unblock_for_listener_after_settlement(server: RunningServer) -> None:
    """SPEC §10.14: a listener registered after settlement gets nothing."""
    create(server, "p", 1000, EXT)
    server.ok("promise.settle", {"id": "p", "state": "resolved"}, 2000)
    server.ok("promise.register_listener", {"awaited": "p", "address": "http://l"}, 3000)
    assert server.snap()["outbox"] == []


def test_no_new_unblock_on_absorbed_settle(server: RunningServer) -> None:
    """A second settle is absorbed (§10.5): no new row, the first one is unchanged."""
    create(server, "p", 1000, EXT)
    server.ok("promise.register_listener", {"awaited": "p", "address": "http://l"}, 1000)
    server.ok("promise.settle", {"id": "p", "state": "resolved"}, 2000)
    before = server.snap()["outbox"]
    server.ok("promise.settle", {"id": "p", "state": "rejected"}, 3000)
    assert server.snap()["outbox"] == before
