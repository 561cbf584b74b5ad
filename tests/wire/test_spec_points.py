"""The 25 subtle points of SPEC.md §10, one or a few named tests each.

Each test drives the server over the wire with ``resonate:debug_time`` and fires
deadline-driven internal steps with ``debug.tick`` (background loops are paused), then
asserts exact records, statuses, versions and instants.  Where troth goes beyond the
specification (served searches, §10.24; schedule doors and occurrence ids, §10.22) the
docstring says so.

troth fires every internal step a request enables inside that request's transaction
(reference README), so obligations of a settled promise are drained by the request
that settles it; deadline-driven steps fire only on ``debug.tick``.  Client reads use
the projected discipline (SPEC.md §1, latitude L1): they persist nothing.
"""

from __future__ import annotations

from typing import Any

from helpers.support import RunningServer
from helpers.wire import EXT, RETRY, TGT, TIMER, action, execute, rc, rows, stored_task

# ----------------------------------------------------------------------------- helpers


def record(
    id: str,
    state: str,
    timeout_at: int,
    created_at: int,
    *,
    tags: dict[str, str] | None = None,
    param: dict[str, Any] | None = None,
    value: dict[str, Any] | None = None,
    settled_at: int | None = None,
) -> dict[str, Any]:
    """The exact wire PromiseRecord (SPEC.md §2.1); ``settledAt`` omitted while absent."""
    r: dict[str, Any] = {
        "id": id,
        "state": state,
        "param": param or {},
        "value": value or {},
        "tags": tags or {},
        "timeoutAt": timeout_at,
        "createdAt": created_at,
    }
    if settled_at is not None:
        r["settledAt"] = settled_at
    return r


def task_rec(
    id: str,
    state: str,
    version: int,
    resumes: int = 0,
    *,
    ttl: int | None = None,
    pid: str | None = None,
) -> dict[str, Any]:
    """The exact wire TaskRecord: ``resumes`` is a count, ttl/pid only while acquired."""
    r: dict[str, Any] = {"id": id, "state": state, "version": version, "resumes": resumes}
    if ttl is not None:
        r["ttl"] = ttl
    if pid is not None:
        r["pid"] = pid
    return r


def create(
    server: RunningServer,
    id: str,
    timeout_at: int,
    now: int,
    tags: dict[str, str] | None = None,
    param: dict[str, Any] | None = None,
) -> dict[str, Any]:
    data = {"id": id, "timeoutAt": timeout_at, "param": param or {}, "tags": tags or {}}
    promise: dict[str, Any] = server.ok("promise.create", data, now)["promise"]
    return promise


def task_create(
    server: RunningServer,
    id: str,
    timeout_at: int,
    now: int,
    *,
    ttl: int = 60_000,
    pid: str = "w1",
    tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    inner = {"id": id, "timeoutAt": timeout_at, "tags": tags if tags is not None else TGT}
    body: dict[str, Any] = server.ok(
        "task.create", {"pid": pid, "ttl": ttl, "action": action("promise.create", inner)}, now
    )
    return body


def stored_promise(server: RunningServer, id: str) -> dict[str, Any]:
    rows = [p for p in server.snap()["promises"] if p["id"] == id]
    assert len(rows) == 1, rows
    row: dict[str, Any] = rows[0]
    return row


def get_promise(server: RunningServer, id: str, now: int) -> dict[str, Any]:
    promise: dict[str, Any] = server.ok("promise.get", {"id": id}, now)["promise"]
    return promise


def get_task(server: RunningServer, id: str, now: int) -> dict[str, Any]:
    task: dict[str, Any] = server.ok("task.get", {"id": id}, now)["task"]
    return task


# ------------------------------------------------------------------ 1. project everywhere


def test_p01_project_everywhere_reads(server: RunningServer) -> None:
    """§10.1: a stored-pending promise past its deadline reads as rejected_timedout
    (resolved for a timer) with settledAt = timeoutAt, and its task as fulfilled with
    ttl/pid cleared, in every endpoint — get, create, settle, listener, task.get,
    task.create, search."""
    task_create(server, "a", 5000, 1000, ttl=10_000)
    create(server, "t", 5000, 1000, TIMER)
    dead = record("a", "rejected_timedout", 5000, 1000, tags=TGT, settled_at=5000)
    timer = record("t", "resolved", 5000, 1000, tags=TIMER, settled_at=5000)

    assert get_promise(server, "a", 4999)["state"] == "pending"
    assert get_promise(server, "a", 5000) == dead
    assert get_promise(server, "t", 5000) == timer
    assert create(server, "a", 9000, 5000, TGT) == dead
    assert server.ok("promise.settle", {"id": "a", "state": "resolved"}, 5001) == {"promise": dead}
    listener = {"awaited": "t", "address": "http://l"}
    assert server.ok("promise.register_listener", listener, 5001) == {"promise": timer}
    assert get_task(server, "a", 5000) == task_rec("a", "fulfilled", 1)
    assert task_create(server, "a", 9000, 5000) == {
        "task": task_rec("a", "fulfilled", 1),
        "promise": dead,
        "preload": [],
    }
    found = server.ok("promise.search", {"state": "rejected_timedout"}, 5000)
    assert found == {"promises": [dead]}
    assert server.ok("task.search", {"state": "fulfilled"}, 5000) == {
        "tasks": [task_rec("a", "fulfilled", 1)]
    }
    # Projected reads persisted nothing, and nothing was registered on the timer.
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "acquired",
        "version": 1,
        "ttl": 10_000,
        "pid": "w1",
        "expiresAt": 11_000,
        "resumes": [],
    }
    assert stored_promise(server, "t")["listeners"] == []


def test_p01_project_everywhere_task_guards(server: RunningServer) -> None:
    """§10.1 / C4 C7: halt, continue, heartbeat and every versioned task call see the
    task of a timed-out promise as fulfilled and refuse (409) or skip it."""
    task_create(server, "a", 5000, 1000, ttl=10_000)
    now = 5000
    assert server.call("task.halt", {"id": "a"}, now)[0] == 409
    assert server.call("task.continue", {"id": "a"}, now)[0] == 409
    assert server.call("task.release", {"id": "a", "version": 1}, now)[0] == 409
    fulfil = action("promise.settle", {"id": "a", "state": "resolved"})
    assert server.call("task.fulfill", {"id": "a", "version": 1, "action": fulfil}, now)[0] == 409
    create(server, "b", 99_000, 1000, EXT)
    suspend = {"id": "a", "version": 1, "actions": [rc("b", "a")]}
    assert server.call("task.suspend", suspend, now)[0] == 409
    fence = action("promise.settle", {"id": "b", "state": "resolved"})
    assert server.call("task.fence", {"id": "a", "version": 1, "action": fence}, now)[0] == 409
    beat = {"pid": "w1", "tasks": [{"id": "a", "version": 1}]}
    assert server.ok("task.heartbeat", beat, now) == {}
    assert stored_task(server, "a")["expiresAt"] == 11_000  # not re-armed to 15000
    assert stored_promise(server, "b")["callbacks"] == []
    assert get_promise(server, "b", now)["state"] == "pending"


def test_p01_project_everywhere_lease_and_dispatch(server: RunningServer) -> None:
    """§10.1 / C5: lease expiry and re-dispatch of a task whose promise is dead do
    nothing but fulfil it; the tick materialises the projection (r1)."""
    task_create(server, "a", 5000, 1000, ttl=10_000)  # lease would expire at 11000
    create(server, "d", 3000, 1000, TGT)  # dispatched at 1000, retry due 6000
    assert rows(server) == {"d": execute("d", 0, 1000)}
    server.tick(11_000)
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "fulfilled",
        "version": 1,
        "resumes": [],
    }
    assert stored_task(server, "d") == {
        "id": "d",
        "state": "fulfilled",
        "version": 0,
        "resumes": [],
    }
    assert stored_promise(server, "a")["state"] == "rejected_timedout"
    assert stored_promise(server, "a")["settledAt"] == 5000
    assert stored_promise(server, "d")["settledAt"] == 3000
    assert rows(server) == {"d": execute("d", 0, 1000)}  # no re-dispatch, no new execute


# ------------------------------------------------------------ 2. inclusive deadline bounds


def test_p02_deadline_boundaries_promise(server: RunningServer) -> None:
    """§10.2: ``timeoutAt <= now`` is dead; a birth is live only if ``timeoutAt > now``."""
    create(server, "p", 5000, 1000)
    assert get_promise(server, "p", 4999) == record("p", "pending", 5000, 1000)
    assert get_promise(server, "p", 5000) == record(
        "p", "rejected_timedout", 5000, 1000, settled_at=5000
    )
    assert create(server, "q", 2000, 2000) == record(
        "q", "rejected_timedout", 2000, 2000, settled_at=2000
    )
    assert create(server, "r", 2001, 2000) == record("r", "pending", 2001, 2000)


def test_p02_deadline_boundaries_lease_and_retry(server: RunningServer) -> None:
    """§10.2: the lease is due at ``expiresAt <= now``, dispatch at ``retryAt <= now``."""
    task_create(server, "a", 100_000, 1000, ttl=100)
    server.tick(1099)
    assert stored_task(server, "a")["state"] == "acquired"
    assert rows(server) == {}
    server.tick(1100)
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "pending",
        "version": 1,
        "retryAt": 1100 + RETRY,
        "resumes": [],
    }
    assert rows(server) == {"a": execute("a", 1, 1100)}
    server.tick(6099)
    assert rows(server) == {"a": execute("a", 1, 1100)}
    server.tick(6100)
    assert rows(server) == {"a": execute("a", 1, 6100)}
    assert stored_task(server, "a")["retryAt"] == 6100 + RETRY


# ---------------------------------------------------------------------- 3. born dead


def test_p03_born_dead_promise(server: RunningServer) -> None:
    """§10.3: a born-dead promise gets createdAt = settledAt = timeoutAt, answers 200,
    and a targeted one gets a fulfilled v0 task and no execute."""
    assert create(server, "x", 500, 1000, TGT) == record(
        "x", "rejected_timedout", 500, 500, tags=TGT, settled_at=500
    )
    assert create(server, "y", 900, 1000, TIMER) == record(
        "y", "resolved", 900, 900, tags=TIMER, settled_at=900
    )
    assert stored_task(server, "x") == {
        "id": "x",
        "state": "fulfilled",
        "version": 0,
        "resumes": [],
    }
    assert server.outbox() == {}


def test_p03_born_dead_task_create(server: RunningServer) -> None:
    """§10.3 / §4.2 T-02.3: task.create of a dead promise → 200, fulfilled v0."""
    assert task_create(server, "z", 800, 1000) == {
        "task": task_rec("z", "fulfilled", 0),
        "promise": record("z", "rejected_timedout", 800, 800, tags=TGT, settled_at=800),
        "preload": [],
    }
    assert server.outbox() == {}


# ------------------------------------------------------------------ 4. idempotency by id


def test_p04_idempotency_by_id_only(server: RunningServer) -> None:
    """§10.4: a second create with other fields returns the existing (projected)
    promise with 200; no conflict, no task added by a late target tag."""
    first = create(server, "p", 5000, 1000, EXT, {"data": "one"})
    assert first == record("p", "pending", 5000, 1000, tags=EXT, param={"data": "one"})
    assert create(server, "p", 9000, 2000, TGT, {"data": "two"}) == first
    assert server.snap()["tasks"] == []
    assert create(server, "p", 9000, 6000, TGT) == record(
        "p", "rejected_timedout", 5000, 1000, tags=EXT, param={"data": "one"}, settled_at=5000
    )


# ---------------------------------------------------------------------- 5. settle absorbs


def test_p05_settle_absorbs(server: RunningServer) -> None:
    """§10.5: settling a settled promise is 200 with the existing record."""
    create(server, "p", 5000, 1000)
    settled = record("p", "resolved", 5000, 1000, value={"data": "v1"}, settled_at=2000)
    body = {"id": "p", "state": "resolved", "value": {"data": "v1"}}
    assert server.ok("promise.settle", body, 2000) == {"promise": settled}
    again = {"id": "p", "state": "rejected", "value": {"data": "v2"}}
    assert server.ok("promise.settle", again, 3000) == {"promise": settled}
    assert get_promise(server, "p", 9000) == settled


def test_p05_late_settle_reports_timeout(server: RunningServer) -> None:
    """§10.5: a late settle answers 200 carrying rejected_timedout, value discarded."""
    create(server, "p", 5000, 1000)
    body = {"id": "p", "state": "resolved", "value": {"data": "late"}}
    assert server.ok("promise.settle", body, 5000) == {
        "promise": record("p", "rejected_timedout", 5000, 1000, settled_at=5000)
    }


def test_p05_client_may_not_send_pending_or_timedout(server: RunningServer) -> None:
    """§10.5: ``pending`` and ``rejected_timedout`` are refused with 400."""
    create(server, "p", 5000, 1000)
    for state in ("pending", "rejected_timedout"):
        status, data = server.call("promise.settle", {"id": "p", "state": state}, 2000)
        assert (status, type(data)) == (400, str)
    assert get_promise(server, "p", 2000) == record("p", "pending", 5000, 1000)


# ---------------------------------------------------------- 6. validation outranks existence


def test_p06_validation_outranks_existence(server: RunningServer) -> None:
    """§10.6: 400 before 404 before 409/422, on ids that do not exist."""
    cases: list[tuple[str, dict[str, Any], int]] = [
        ("promise.register_listener", {"awaited": "nope", "address": "tcp://x"}, 400),
        ("promise.settle", {"id": "nope", "state": "pending"}, 400),
        ("promise.register_callback", {"awaited": "nope", "awaiter": "nope"}, 400),
        ("task.suspend", {"id": "nope", "version": 1, "actions": []}, 400),
        (
            "task.fulfill",
            {
                "id": "nope",
                "version": 1,
                "action": action("promise.settle", {"id": "nope", "state": "rejected_timedout"}),
            },
            400,
        ),
        (
            "task.fence",
            {
                "id": "nope",
                "version": 1,
                "action": action("promise.settle", {"id": "nope", "state": "resolved"}),
            },
            400,
        ),
        (
            "task.create",
            {
                "pid": "w",
                "ttl": 1,
                "action": action("promise.create", {"id": "nope", "timeoutAt": 9000}),
            },
            400,
        ),
        ("promise.register_callback", {"awaited": "nope", "awaiter": "nope2"}, 404),
        ("promise.register_listener", {"awaited": "nope", "address": "http://x"}, 404),
    ]
    for kind, data, status in cases:
        got, body = server.call(kind, data, 1000)
        assert (got, type(body)) == (status, str), (kind, data, got, body)
    assert server.snap() == {"promises": [], "tasks": [], "schedules": [], "outbox": []}


# ------------------------------------------------------------------ 7. timer + target


def test_p07_timer_target_refused_everywhere(server: RunningServer) -> None:
    """§10.7: timer + target is refused at promise.create, task.create and
    schedule.create; nothing is created."""
    both = {**TIMER, **TGT}
    status, _ = server.call("promise.create", {"id": "p", "timeoutAt": 9000, "tags": both}, 1000)
    assert status == 400
    inner = action("promise.create", {"id": "p", "timeoutAt": 9000, "tags": both})
    assert server.call("task.create", {"pid": "w", "ttl": 10, "action": inner}, 1000)[0] == 400
    sched = {
        "id": "s",
        "cron": "*/10 * * * * *",
        "promiseId": "{{.timestamp}}",
        "promiseTimeout": 1,
        "promiseTags": both,
    }
    assert server.call("schedule.create", sched, 1000)[0] == 400
    snap = server.snap()
    assert snap["promises"] == []
    assert snap["schedules"] == []


def test_p07_fenced_sdk_sleep_is_stored_as_a_plain_timer(server: RunningServer) -> None:
    """The one deliberate exception (docs/protocol.md): both SDKs create ``ctx.sleep``
    as timer + target through ``task.fence``.  troth accepts it there and stores a plain
    timer without the target: no task, no dispatch; the deadline resolves it and wakes
    the suspended awaiter."""
    both = {**TIMER, **TGT}
    task_create(server, "f", 99_000, 1000)
    inner = action("promise.create", {"id": "f:1", "timeoutAt": 5000, "tags": both})
    out = server.ok("task.fence", {"id": "f", "version": 1, "action": inner}, 1000)
    assert out["action"]["head"]["status"] == 200
    assert out["action"]["data"]["promise"]["tags"] == TIMER
    snap = server.snap()
    assert [t["id"] for t in snap["tasks"]] == ["f"]
    assert server.outbox() == {}
    suspend = action("promise.register_callback", {"awaited": "f:1", "awaiter": "f"})
    assert server.call("task.suspend", {"id": "f", "version": 1, "actions": [suspend]}, 1001) == (
        200,
        {},
    )
    server.tick(5000)
    timer = server.ok("promise.get", {"id": "f:1"}, 5000)["promise"]
    assert (timer["state"], timer["settledAt"]) == ("resolved", 5000)
    assert server.ok("task.get", {"id": "f"}, 5000)["task"] == {
        "id": "f",
        "state": "pending",
        "version": 1,
        "resumes": 1,
    }
    assert set(server.outbox()) == {"f"}


# ---------------------------------------------------------------- 8. resonate:delay


def test_p08_delay_is_an_absolute_instant(server: RunningServer) -> None:
    """§10.8: first dispatch at max(delay, now); a future delay sends nothing until
    the delay instant."""
    create(server, "a", 100_000, 1000, {**TGT, "resonate:delay": "3000"})
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "pending",
        "version": 0,
        "retryAt": 3000,
        "resumes": [],
    }
    assert server.outbox() == {}
    server.tick(2999)
    assert server.outbox() == {}
    server.tick(3000)
    assert rows(server) == {"a": execute("a", 0, 3000)}
    assert stored_task(server, "a")["retryAt"] == 3000 + RETRY


def test_p08_elapsed_delay_dispatches_at_once(server: RunningServer) -> None:
    """§10.8: a delay in the past dispatches at now."""
    create(server, "a", 100_000, 1000, {**TGT, "resonate:delay": "500"})
    assert rows(server) == {"a": execute("a", 0, 1000)}
    assert stored_task(server, "a")["retryAt"] == 1000 + RETRY


def test_p08_delay_is_parsed_totally(server: RunningServer) -> None:
    """§10.8 / §2.3 parseNat: total left fold, non-digits give garbage, never 400.
    "3:00" → ((3·10+10)·10+0)·10+0 = 4000; "abc" → 49·100+50·10+51 = 5451;
    "-5" → '-' truncates to 0 → 5 (elapsed)."""
    create(server, "a", 100_000, 1000, {**TGT, "resonate:delay": "3:00"})
    create(server, "b", 100_000, 1000, {**TGT, "resonate:delay": "abc"})
    create(server, "c", 100_000, 1000, {**TGT, "resonate:delay": "-5"})
    assert stored_task(server, "a")["retryAt"] == 4000
    assert stored_task(server, "b")["retryAt"] == 5451
    assert stored_task(server, "c")["retryAt"] == 1000 + RETRY
    assert rows(server) == {"c": execute("c", 0, 1000)}


# ----------------------------------------------------------------- 9. version arithmetic


def test_p09_version_arithmetic(server: RunningServer) -> None:
    """§10.9: +1 only on acquisition; promise.create starts at v0 (pending),
    task.create at v1 (acquired); release, lease expiry, halt/continue keep it;
    execute carries the current version and acquire must present it."""
    create(server, "a", 100_000, 1000, TGT)
    assert rows(server) == {"a": execute("a", 0, 1000)}
    assert (
        server.call("task.acquire", {"id": "a", "version": 1, "pid": "w", "ttl": 100}, 1100)[0]
        == 409
    )
    got = server.ok("task.acquire", {"id": "a", "version": 0, "pid": "w", "ttl": 100}, 1100)
    assert got["task"] == task_rec("a", "acquired", 1, ttl=100, pid="w")
    assert (
        server.call("task.acquire", {"id": "a", "version": 0, "pid": "w", "ttl": 100}, 1100)[0]
        == 409
    )
    server.ok("task.release", {"id": "a", "version": 1}, 1200)
    assert get_task(server, "a", 1200) == task_rec("a", "pending", 1)
    assert rows(server) == {"a": execute("a", 1, 1200)}
    server.ok("task.halt", {"id": "a"}, 1300)
    assert get_task(server, "a", 1300) == task_rec("a", "halted", 1)
    server.ok("task.continue", {"id": "a"}, 1400)
    assert get_task(server, "a", 1400) == task_rec("a", "pending", 1)
    assert rows(server) == {"a": execute("a", 1, 1400)}
    got = server.ok("task.acquire", {"id": "a", "version": 1, "pid": "w", "ttl": 100}, 1500)
    assert got["task"] == task_rec("a", "acquired", 2, ttl=100, pid="w")
    server.tick(1600)  # lease expiry
    assert get_task(server, "a", 1600) == task_rec("a", "pending", 2)
    assert rows(server) == {"a": execute("a", 2, 1600)}
    assert task_create(server, "b", 100_000, 1700, ttl=50)["task"] == task_rec(
        "b", "acquired", 1, ttl=50, pid="w1"
    )


# ---------------------------------------------------------- 10. task.create on existing id


def test_p10_task_create_reacquires_pending(server: RunningServer) -> None:
    """§10.10: a pending task is re-acquired without a version check; the request's
    timeout/param/tags are ignored."""
    create(server, "a", 100_000, 1000, TGT)
    got = server.ok(
        "task.create",
        {
            "pid": "w2",
            "ttl": 500,
            "action": action(
                "promise.create",
                {"id": "a", "timeoutAt": 50_000, "param": {"data": "x"}, "tags": {**TGT, "k": "v"}},
            ),
        },
        2000,
    )
    assert got == {
        "task": task_rec("a", "acquired", 1, ttl=500, pid="w2"),
        "promise": record("a", "pending", 100_000, 1000, tags=TGT),
        "preload": [],
    }
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "acquired",
        "version": 1,
        "ttl": 500,
        "pid": "w2",
        "expiresAt": 2500,
        "resumes": [],
    }


def test_p10_task_create_existing_states(server: RunningServer) -> None:
    """§10.10: 409 for acquired (even same pid), suspended and halted; 200 fulfilled for
    a settled one; 422 when the existing promise is untargeted."""
    task_create(server, "acq", 100_000, 1000)
    create(server, "ext", 100_000, 1000, EXT)
    task_create(server, "sus", 100_000, 1000)
    server.ok("task.suspend", {"id": "sus", "version": 1, "actions": [rc("ext", "sus")]}, 1000)
    task_create(server, "hal", 100_000, 1000)
    server.ok("task.halt", {"id": "hal"}, 1000)
    for id in ("acq", "sus", "hal"):
        inner = action("promise.create", {"id": id, "timeoutAt": 100_000, "tags": TGT})
        status, data = server.call("task.create", {"pid": "w1", "ttl": 10, "action": inner}, 2000)
        assert (status, type(data)) == (409, str), id
    create(server, "done", 100_000, 1000, TGT)
    server.ok("promise.settle", {"id": "done", "state": "resolved"}, 1500)
    assert task_create(server, "done", 100_000, 2000) == {
        "task": task_rec("done", "fulfilled", 0),
        "promise": record("done", "resolved", 100_000, 1000, tags=TGT, settled_at=1500),
        "preload": [],
    }
    inner = action("promise.create", {"id": "ext", "timeoutAt": 100_000, "tags": TGT})
    assert server.call("task.create", {"pid": "w1", "ttl": 10, "action": inner}, 2000)[0] == 422


# ------------------------------------------------------------------ 11. fulfill and fence


def test_p11_fulfill_settles_own_promise(server: RunningServer) -> None:
    """§10.11: task.fulfill settles the task's own promise; action.id is ignored."""
    task_create(server, "a", 100_000, 1000)
    create(server, "other", 100_000, 1000, EXT)
    settle = action("promise.settle", {"id": "other", "state": "resolved", "value": {"data": "x"}})
    assert server.ok("task.fulfill", {"id": "a", "version": 1, "action": settle}, 2000) == {
        "promise": record(
            "a", "resolved", 100_000, 1000, tags=TGT, value={"data": "x"}, settled_at=2000
        )
    }
    assert get_promise(server, "other", 2000)["state"] == "pending"
    assert get_task(server, "a", 2000) == task_rec("a", "fulfilled", 1)


def test_p11_fence(server: RunningServer) -> None:
    """§10.11: fence may not target its own promise (400); the outer status is 200
    whenever the fence holds, with the inner status separate; an inner create of a
    targeted promise creates its task (pending v0, dispatched)."""
    task_create(server, "a", 100_000, 1000)
    own = action("promise.settle", {"id": "a", "state": "resolved"})
    assert server.call("task.fence", {"id": "a", "version": 1, "action": own}, 1000)[0] == 400
    missing = action("promise.settle", {"id": "nope", "state": "resolved"})
    out = server.ok("task.fence", {"id": "a", "version": 1, "action": missing}, 1000)
    assert out["action"]["head"]["status"] == 404
    assert isinstance(out["action"]["data"], str)
    child = action("promise.create", {"id": "c", "timeoutAt": 50_000, "tags": TGT})
    out = server.ok("task.fence", {"id": "a", "version": 1, "action": child}, 1500)
    assert out["action"]["kind"] == "promise.create"
    assert out["action"]["head"]["status"] == 200
    assert out["action"]["data"] == {"promise": record("c", "pending", 50_000, 1500, tags=TGT)}
    assert out["preload"] == []
    assert stored_task(server, "c") == {
        "id": "c",
        "state": "pending",
        "version": 0,
        "retryAt": 1500 + RETRY,
        "resumes": [],
    }
    assert rows(server) == {"c": execute("c", 0, 1500)}
    assert server.call("task.fence", {"id": "a", "version": 2, "action": child}, 1500)[0] == 409


# ------------------------------------------------------------------------ 12. suspend


def test_p12_suspend_200_registers_task_id_and_clears(server: RunningServer) -> None:
    """§10.12: 200 registers the task id on every awaited (the action's awaiter is
    ignored) and clears pid/ttl/expiresAt/retryAt/resumes."""
    task_create(server, "a", 100_000, 1000, ttl=10_000)
    create(server, "b", 100_000, 1000, EXT)
    create(server, "c", 100_000, 1000, TGT)
    body = {"id": "a", "version": 1, "actions": [rc("b", "bogus"), rc("c", "other")]}
    assert server.call("task.suspend", body, 2000) == (200, {})
    assert stored_promise(server, "b")["callbacks"] == ["a"]
    assert stored_promise(server, "c")["callbacks"] == ["a"]
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "suspended",
        "version": 1,
        "resumes": [],
    }
    assert get_task(server, "a", 2000) == task_rec("a", "suspended", 1)


def test_p12_suspend_300_keeps_lease_clears_resumes(server: RunningServer) -> None:
    """§10.12: if any awaited is settled → 300, nothing registered, the lease is kept
    (same version, pid, ttl, expiresAt) and resumes are cleared."""
    task_create(server, "a", 100_000, 1000, ttl=10_000)
    create(server, "b", 100_000, 1000, EXT)
    create(server, "c", 100_000, 1000, EXT)
    server.ok("promise.register_callback", {"awaited": "b", "awaiter": "a"}, 1000)
    server.ok("promise.settle", {"id": "b", "state": "resolved"}, 2000)
    assert get_task(server, "a", 2000) == task_rec("a", "acquired", 1, 1, ttl=10_000, pid="w1")
    body = {"id": "a", "version": 1, "actions": [rc("c", "a"), rc("b", "a")]}
    assert server.call("task.suspend", body, 3000) == (300, {"preload": []})
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "acquired",
        "version": 1,
        "ttl": 10_000,
        "pid": "w1",
        "expiresAt": 11_000,
        "resumes": [],
    }
    assert stored_promise(server, "c")["callbacks"] == []


def test_p12_suspend_422_beats_300(server: RunningServer) -> None:
    """§10.12: a missing or internal awaited → 422, wherever it appears in the list,
    even when another awaited is already settled (which alone would give 300)."""
    task_create(server, "a", 100_000, 1000)
    create(server, "done", 100_000, 1000, EXT)
    server.ok("promise.settle", {"id": "done", "state": "resolved"}, 1000)
    create(server, "internal", 100_000, 1000)
    before = server.snap()
    for awaited in (["done", "nope"], ["nope", "done"], ["done", "internal"], ["internal", "done"]):
        body = {"id": "a", "version": 1, "actions": [rc(x, "a") for x in awaited]}
        status, data = server.call("task.suspend", body, 2000)
        assert (status, type(data)) == (422, str), awaited
    assert server.snap() == before


# ---------------------------------------------------------------- 13. register_callback


def test_p13_register_callback(server: RunningServer) -> None:
    """§10.13: awaiter missing → 422 (not 404), awaiter untargeted → 422, awaited
    internal → 422; 200 without registering when either side is not pending."""
    create(server, "ext", 100_000, 1000, EXT)
    create(server, "internal", 100_000, 1000)
    create(server, "aw", 100_000, 1000, TGT)
    create(server, "dead", 100_000, 1000, TGT)
    server.ok("promise.settle", {"id": "dead", "state": "rejected"}, 1000)
    call = "promise.register_callback"
    assert server.call(call, {"awaited": "ext", "awaiter": "nope"}, 2000)[0] == 422
    assert server.call(call, {"awaited": "ext", "awaiter": "internal"}, 2000)[0] == 422
    assert server.call(call, {"awaited": "internal", "awaiter": "aw"}, 2000)[0] == 422
    pending_ext = record("ext", "pending", 100_000, 1000, tags=EXT)
    assert server.ok(call, {"awaited": "ext", "awaiter": "dead"}, 2000) == {"promise": pending_ext}
    assert stored_promise(server, "ext")["callbacks"] == []
    assert server.ok(call, {"awaited": "ext", "awaiter": "aw"}, 2000) == {"promise": pending_ext}
    assert server.ok(call, {"awaited": "ext", "awaiter": "aw"}, 2001) == {"promise": pending_ext}
    assert stored_promise(server, "ext")["callbacks"] == ["aw"]
    create(server, "late", 1500, 1000, TGT)  # awaiter dead by projection at 2000
    assert server.ok(call, {"awaited": "ext", "awaiter": "late"}, 2000) == {"promise": pending_ext}
    assert stored_promise(server, "ext")["callbacks"] == ["aw"]
    settled = server.ok(call, {"awaited": "dead", "awaiter": "aw"}, 2000)
    assert settled == {
        "promise": record("dead", "rejected", 100_000, 1000, tags=TGT, settled_at=1000)
    }
    assert stored_promise(server, "dead")["callbacks"] == []


# ---------------------------------------------------------- 14. obligations survive settle


def test_p14_obligations_survive_until_drained(server: RunningServer) -> None:
    """§10.14: a read of a timed-out promise does not drop its callbacks/listeners;
    the drain (r1 then r3/r4 on tick) resumes the awaiter and enqueues the unblock.
    A listener registered after settlement gets nothing."""
    task_create(server, "a", 100_000, 1000)
    create(server, "b", 5000, 1000, EXT)
    server.ok("task.suspend", {"id": "a", "version": 1, "actions": [rc("b", "a")]}, 1000)
    server.ok("promise.register_listener", {"awaited": "b", "address": "http://l1"}, 1000)
    assert get_promise(server, "b", 5000)["state"] == "rejected_timedout"
    stored = stored_promise(server, "b")
    assert (stored["callbacks"], stored["listeners"]) == (["a"], ["http://l1"])
    server.tick(5000)
    stored = stored_promise(server, "b")
    assert (stored["state"], stored["callbacks"], stored["listeners"]) == (
        "rejected_timedout",
        [],
        [],
    )
    dead = record("b", "rejected_timedout", 5000, 1000, tags=EXT, settled_at=5000)
    assert server.outbox()["b:notify:http://l1"]["message"] == {"kind": "unblock", "promise": dead}
    assert rows(server)["a"] == execute("a", 1, 5000)
    assert get_task(server, "a", 5000) == task_rec("a", "pending", 1, 1)
    assert server.ok(
        "promise.register_listener", {"awaited": "b", "address": "http://l2"}, 6000
    ) == {"promise": dead}
    assert "b:notify:http://l2" not in server.outbox()
    assert stored_promise(server, "b")["listeners"] == []


# ------------------------------------------------------------ 15. timeout wins in resume


def test_p15_dead_awaiter_is_not_resumed(server: RunningServer) -> None:
    """§10.15 / C6: the awaiter's own deadline is materialised before resuming; a dead
    awaiter is dropped (fulfilled, no execute)."""
    task_create(server, "a", 3000, 1000)
    create(server, "b", 100_000, 1000, EXT)
    server.ok("task.suspend", {"id": "a", "version": 1, "actions": [rc("b", "a")]}, 1500)
    server.ok("promise.settle", {"id": "b", "state": "resolved"}, 4000)
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "fulfilled",
        "version": 1,
        "resumes": [],
    }
    assert stored_promise(server, "a")["state"] == "rejected_timedout"
    assert stored_promise(server, "a")["settledAt"] == 3000
    assert stored_promise(server, "b")["callbacks"] == []
    assert server.outbox() == {}


def test_p15_live_unsuspended_awaiter_buffers(server: RunningServer) -> None:
    """§10.15: a live non-suspended awaiter only buffers the awaited id in resumes."""
    task_create(server, "a", 100_000, 1000)
    create(server, "b", 100_000, 1000, EXT)
    server.ok("promise.register_callback", {"awaited": "b", "awaiter": "a"}, 1000)
    server.ok("promise.settle", {"id": "b", "state": "resolved"}, 2000)
    assert stored_task(server, "a")["resumes"] == ["b"]
    assert stored_task(server, "a")["state"] == "acquired"
    assert server.outbox() == {}


def test_p15_buffered_resumes_kept_until_acquisition(server: RunningServer) -> None:
    """§10.15 with §4.2: buffered resumes survive release and lease expiry (r5) and
    are cleared only when the task is acquired again (T-03.3)."""
    task_create(server, "a", 100_000, 1000, ttl=100)
    task_create(server, "c", 100_000, 1000, ttl=100)
    create(server, "b", 100_000, 1000, EXT)
    for awaiter in ("a", "c"):
        server.ok("promise.register_callback", {"awaited": "b", "awaiter": awaiter}, 1000)
    server.ok("promise.settle", {"id": "b", "state": "resolved"}, 1050)
    server.ok("task.release", {"id": "a", "version": 1}, 1060)
    assert stored_task(server, "a")["resumes"] == ["b"]
    server.tick(1100)  # c's lease expires
    assert stored_task(server, "c") == {
        "id": "c",
        "state": "pending",
        "version": 1,
        "retryAt": 1100 + RETRY,
        "resumes": ["b"],
    }
    assert get_task(server, "c", 1100) == task_rec("c", "pending", 1, 1)
    got = server.ok("task.acquire", {"id": "a", "version": 1, "pid": "w", "ttl": 100}, 1200)
    assert got["task"] == task_rec("a", "acquired", 2, 0, ttl=100, pid="w")
    assert stored_task(server, "a")["resumes"] == []


# --------------------------------------------------------------------- 16. retry cadence


def test_p16_retry_cadence_is_server_config(server: RunningServer) -> None:
    """§10.16: re-dispatch every retryTimeout (5000 ms), not the task ttl; every entry
    into pending sets retryAt = now (immediate dispatch), re-arm strictly later."""
    task_create(server, "a", 100_000, 1000, ttl=100)
    server.ok("task.release", {"id": "a", "version": 1}, 1050)
    assert stored_task(server, "a")["retryAt"] == 1050 + RETRY
    assert rows(server) == {"a": execute("a", 1, 1050)}
    server.tick(1150)  # a ttl-based cadence would re-dispatch here
    assert rows(server) == {"a": execute("a", 1, 1050)}
    server.tick(6050)
    assert rows(server) == {"a": execute("a", 1, 6050)}
    assert stored_task(server, "a")["retryAt"] == 11_050
    server.ok("task.acquire", {"id": "a", "version": 1, "pid": "w", "ttl": 100}, 7000)
    server.tick(7100)  # lease expiry: pending with retryAt = now, dispatched at once
    assert rows(server) == {"a": execute("a", 2, 7100)}
    assert stored_task(server, "a")["retryAt"] == 7100 + RETRY


# ---------------------------------------------------------------------- 17. outbox keys


def test_p17_outbox_keys(server: RunningServer) -> None:
    """§10.17: execute coalesces per task id (latest version wins, one row);
    unblock is keyed per (promise, address)."""
    create(server, "a", 100_000, 1000, TGT)
    server.ok("task.acquire", {"id": "a", "version": 0, "pid": "w", "ttl": 100}, 1100)
    server.ok("task.release", {"id": "a", "version": 1}, 1200)
    all_rows = server.snap()["outbox"]
    assert [(r["key"], r["message"]["version"]) for r in all_rows] == [("a", 1)]
    create(server, "b", 100_000, 1000, EXT)
    for address in ("http://l1", "poll://any@g"):
        server.ok("promise.register_listener", {"awaited": "b", "address": address}, 1300)
    server.ok("promise.settle", {"id": "b", "state": "resolved"}, 1400)
    settled = record("b", "resolved", 100_000, 1000, tags=EXT, settled_at=1400)
    assert rows(server) == {
        "a": execute("a", 1, 1200),
        "b:notify:http://l1": {
            "key": "b:notify:http://l1",
            "address": "http://l1",
            "message": {"kind": "unblock", "promise": settled},
            "createdAt": 1400,
        },
        "b:notify:poll://any@g": {
            "key": "b:notify:poll://any@g",
            "address": "poll://any@g",
            "message": {"kind": "unblock", "promise": settled},
            "createdAt": 1400,
        },
    }


# ----------------------------------------------------------------- 18. lease fields, heartbeat


def test_p18_lease_fields_cleared_when_lease_ends(server: RunningServer) -> None:
    """§10.18: ttl/pid/expiresAt are cleared on release, suspend, halt, lease expiry
    and fulfilment; records then show no ttl/pid."""
    create(server, "ext", 100_000, 1000, EXT)
    for id in ("rel", "sus", "hal", "exp", "ful"):
        task_create(server, id, 100_000, 1000, ttl=500)
    server.ok("task.release", {"id": "rel", "version": 1}, 1100)
    server.ok("task.suspend", {"id": "sus", "version": 1, "actions": [rc("ext", "sus")]}, 1100)
    server.ok("task.halt", {"id": "hal"}, 1100)
    settle = action("promise.settle", {"id": "ful", "state": "resolved"})
    server.ok("task.fulfill", {"id": "ful", "version": 1, "action": settle}, 1100)
    server.ok("task.heartbeat", {"pid": "w1", "tasks": [{"id": "rel", "version": 1}]}, 1200)
    server.tick(1500)  # "exp" lease expires; the others have no lease to expire
    expected = {
        "rel": task_rec("rel", "pending", 1),
        "sus": task_rec("sus", "suspended", 1),
        "hal": task_rec("hal", "halted", 1),
        "exp": task_rec("exp", "pending", 1),
        "ful": task_rec("ful", "fulfilled", 1),
    }
    for id, rec in expected.items():
        assert get_task(server, id, 1500) == rec
    for t in server.snap()["tasks"]:
        assert {"ttl", "pid", "expiresAt"} & t.keys() == set(), t


def test_p18_heartbeat_rearms_from_stored_ttl_and_skips(server: RunningServer) -> None:
    """§10.18: heartbeat re-arms expiresAt = now + stored ttl; silently skips a wrong
    pid, version or state, a dead promise and a missing task, still answering 200."""
    task_create(server, "a", 100_000, 1000, ttl=100)
    task_create(server, "d", 1040, 1000, ttl=1000)  # promise dead at 1040
    create(server, "p", 100_000, 1000, TGT)  # pending task
    refs = [
        {"id": "a", "version": 1},
        {"id": "d", "version": 1},
        {"id": "p", "version": 0},
        {"id": "nope", "version": 1},
    ]
    assert server.ok("task.heartbeat", {"pid": "w1", "tasks": refs}, 1050) == {}
    assert stored_task(server, "a")["expiresAt"] == 1150
    assert stored_task(server, "d")["expiresAt"] == 2000
    assert stored_task(server, "p")["state"] == "pending"
    beat = {"pid": "other", "tasks": [{"id": "a", "version": 1}]}
    assert server.ok("task.heartbeat", beat, 1100) == {}
    beat = {"pid": "w1", "tasks": [{"id": "a", "version": 2}]}
    assert server.ok("task.heartbeat", beat, 1100) == {}
    assert stored_task(server, "a")["expiresAt"] == 1150
    server.tick(1149)
    assert stored_task(server, "a")["state"] == "acquired"


# --------------------------------------------------------------------- 19. halt / continue


def test_p19_halt(server: RunningServer) -> None:
    """§10.19: halt is idempotent, keeps version and resumes, leaves callbacks in
    place; 409 on fulfilled, including fulfilled by projection."""
    task_create(server, "a", 100_000, 1000)
    create(server, "b", 100_000, 1000, EXT)
    create(server, "c", 100_000, 1000, EXT)
    server.ok("promise.register_callback", {"awaited": "c", "awaiter": "a"}, 1000)
    server.ok("promise.settle", {"id": "c", "state": "resolved"}, 1100)  # buffers "c"
    task_create(server, "s", 100_000, 1000)
    server.ok("task.suspend", {"id": "s", "version": 1, "actions": [rc("b", "s")]}, 1200)
    assert server.call("task.halt", {"id": "a"}, 1300) == (200, {})
    assert server.call("task.halt", {"id": "s"}, 1300) == (200, {})
    before = server.snap()
    assert server.call("task.halt", {"id": "a"}, 1400) == (200, {})
    assert server.snap() == before
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "halted",
        "version": 1,
        "resumes": ["c"],
    }
    assert get_task(server, "a", 1400) == task_rec("a", "halted", 1, 1)
    assert stored_promise(server, "b")["callbacks"] == ["s"]
    assert server.outbox() == {}
    create(server, "f", 100_000, 1000, TGT)
    server.ok("promise.settle", {"id": "f", "state": "resolved"}, 1500)
    assert server.call("task.halt", {"id": "f"}, 1500)[0] == 409
    task_create(server, "t", 3000, 1000)
    assert server.call("task.halt", {"id": "t"}, 3000)[0] == 409


def test_p19_continue(server: RunningServer) -> None:
    """§10.19: continue requires halted (409 otherwise, checked before the promise),
    keeps version and resumes, and dispatches at once (retryAt = now)."""
    task_create(server, "a", 100_000, 1000)
    assert server.call("task.continue", {"id": "a"}, 1000)[0] == 409
    assert server.call("task.continue", {"id": "nope"}, 1000)[0] == 404
    server.ok("task.halt", {"id": "a"}, 1100)
    assert server.call("task.continue", {"id": "a"}, 1200) == (200, {})
    assert stored_task(server, "a") == {
        "id": "a",
        "state": "pending",
        "version": 1,
        "retryAt": 1200 + RETRY,
        "resumes": [],
    }
    assert rows(server) == {"a": execute("a", 1, 1200)}
    assert server.call("task.continue", {"id": "a"}, 1300)[0] == 409
    task_create(server, "d", 3000, 1000)
    server.ok("task.halt", {"id": "d"}, 2000)
    assert server.call("task.continue", {"id": "d"}, 3000)[0] == 409


# -------------------------------------------------------------- 20. internal-step authority


def test_p20_internal_steps_never_acquire_suspend_halt_continue(server: RunningServer) -> None:
    """§10.20: ticks never acquire a pending task, never continue a halted one (an
    awaited settling only buffers), never un-suspend without a settlement, and settle
    promises only by their deadline (timer → resolved, else rejected_timedout)."""
    create(server, "p", 100_000, 1000, TGT)
    task_create(server, "h", 100_000, 1000)
    task_create(server, "s", 100_000, 1000)
    create(server, "never", 100_000, 1000, EXT)
    create(server, "timer", 3000, 1000, TIMER)
    create(server, "ext", 3000, 1000, EXT)
    server.ok("task.suspend", {"id": "s", "version": 1, "actions": [rc("never", "s")]}, 1000)
    server.ok("task.halt", {"id": "h"}, 1000)
    server.ok("promise.register_callback", {"awaited": "timer", "awaiter": "h"}, 1000)
    for now in (3000, 6000, 11_000, 16_000):
        server.tick(now)
    assert stored_task(server, "p")["state"] == "pending"
    assert stored_task(server, "p")["version"] == 0
    assert stored_task(server, "h") == {
        "id": "h",
        "state": "halted",
        "version": 1,
        "resumes": ["timer"],
    }
    assert stored_task(server, "s") == {
        "id": "s",
        "state": "suspended",
        "version": 1,
        "resumes": [],
    }
    assert stored_promise(server, "timer")["state"] == "resolved"
    assert stored_promise(server, "timer")["settledAt"] == 3000
    assert stored_promise(server, "ext")["state"] == "rejected_timedout"
    assert stored_promise(server, "never")["state"] == "pending"
    assert set(server.outbox()) == {"p"}


# ---------------------------------------------------------- 21. settling fulfils the task


def test_p21_settling_fulfils_task_same_transaction(server: RunningServer) -> None:
    """§10.21: client settle, task.fulfill, fence-settle and the deadline each fulfil
    the co-keyed task in the same transaction; a fulfilled task is never re-dispatched."""
    task_create(server, "c", 100_000, 1000)
    task_create(server, "f", 100_000, 1000)
    task_create(server, "fenced", 100_000, 1000)
    task_create(server, "x", 100_000, 1000)
    create(server, "d", 3000, 1000, TGT)
    server.ok("promise.settle", {"id": "c", "state": "rejected_canceled"}, 2000)
    settle = action("promise.settle", {"id": "f", "state": "resolved"})
    server.ok("task.fulfill", {"id": "f", "version": 1, "action": settle}, 2000)
    fence = action("promise.settle", {"id": "fenced", "state": "rejected"})
    out = server.ok("task.fence", {"id": "x", "version": 1, "action": fence}, 2000)
    assert out["action"]["head"]["status"] == 200
    cleared = {"state": "fulfilled", "version": 1, "resumes": []}
    for id in ("c", "f", "fenced"):
        assert stored_task(server, id) == {"id": id, **cleared}
    server.tick(3000)
    assert stored_task(server, "d") == {
        "id": "d",
        "state": "fulfilled",
        "version": 0,
        "resumes": [],
    }
    server.tick(6000)
    assert rows(server) == {"d": execute("d", 0, 1000)}


# ------------------------------------------------------------------------- 22. schedules


SCHED = {
    "id": "s",
    "cron": "*/10 * * * * *",
    "promiseId": "{{.id}}.{{.timestamp}}",
    "promiseTimeout": 60_000,
    "promiseParam": {"data": "x"},
    "promiseTags": {"k": "v"},
}


def occurrence_tags(id: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """promiseTags + resonate:schedule, plus troth's lineage tags (origin/branch/parent
    = the occurrence id, as the reference server sets them, REFERENCE-SERVER §2.6)."""
    return {
        "resonate:origin": id,
        "resonate:branch": id,
        "resonate:parent": id,
        "k": "v",
        **(extra or {}),
        "resonate:schedule": "s",
    }


def test_p22_schedule_create_and_get(server: RunningServer) -> None:
    """§10.22 / §4.3: created with nextRunAt = nextCron(cron, now) strictly after now;
    a second create returns the existing schedule (no comparison)."""
    expected = {**SCHED, "createdAt": 1000, "nextRunAt": 10_000}
    assert server.ok("schedule.create", SCHED, 1000) == {"schedule": expected}
    assert server.ok("schedule.create", {**SCHED, "cron": "0 * * * * *"}, 2000) == {
        "schedule": expected
    }
    assert server.ok("schedule.get", {"id": "s"}, 2000) == {"schedule": expected}
    at_boundary = {**SCHED, "id": "b"}
    assert server.ok("schedule.create", at_boundary, 20_000)["schedule"]["nextRunAt"] == 30_000


def test_p22_occurrence_created_at_its_instant(server: RunningServer) -> None:
    """§10.22: the occurrence id is ``~{scheduleId}/{expanded template}``, created at
    the occurrence instant (createdAt = t, timeoutAt = t + promiseTimeout)."""
    server.ok("schedule.create", SCHED, 1000)
    server.tick(9999)
    assert server.snap()["promises"] == []
    server.tick(12_000)
    oid = "~s/s.10000"
    assert get_promise(server, oid, 12_000) == record(
        oid, "pending", 70_000, 10_000, tags=occurrence_tags(oid), param={"data": "x"}
    )
    assert server.ok("schedule.get", {"id": "s"}, 12_000)["schedule"] == {
        **SCHED,
        "createdAt": 1000,
        "nextRunAt": 20_000,
        "lastRunAt": 10_000,
    }


def test_p22_catch_up_creates_every_missed_occurrence(server: RunningServer) -> None:
    """§10.22: one tick creates every missed occurrence, each as if on time; one whose
    relative promiseTimeout has passed reads as timed out at t + promiseTimeout."""
    server.ok("schedule.create", {**SCHED, "promiseTimeout": 15_000}, 1000)
    server.tick(35_000)
    ids = [p["id"] for p in server.snap()["promises"]]
    assert ids == ["~s/s.10000", "~s/s.20000", "~s/s.30000"]
    assert get_promise(server, "~s/s.10000", 35_000) == record(
        "~s/s.10000",
        "rejected_timedout",
        25_000,
        10_000,
        tags=occurrence_tags("~s/s.10000"),
        param={"data": "x"},
        settled_at=25_000,
    )
    assert get_promise(server, "~s/s.30000", 35_000)["state"] == "pending"
    assert get_promise(server, "~s/s.30000", 35_000)["createdAt"] == 30_000
    schedule = server.ok("schedule.get", {"id": "s"}, 35_000)["schedule"]
    assert (schedule["lastRunAt"], schedule["nextRunAt"]) == (30_000, 40_000)


def test_p22_long_catch_up_in_one_tick(server: RunningServer) -> None:
    """§10.22: every missed occurrence, even more than one firing's batch (troth bounds
    work per firing, §7 P6), is created by one ``debug.tick``; promiseTimeout 0 makes
    each born dead (createdAt = settledAt = timeoutAt = t)."""
    sched = {**SCHED, "cron": "* * * * * *", "promiseTimeout": 0}
    server.ok("schedule.create", sched, 1000)
    server.tick(1_501_000)
    promises = server.snap()["promises"]
    assert len(promises) == 1500
    assert {p["id"] for p in promises} == {f"~s/s.{t}" for t in range(2000, 1_501_001, 1000)}
    last = "~s/s.1501000"
    assert get_promise(server, last, 1_501_000) == record(
        last,
        "rejected_timedout",
        1_501_000,
        1_501_000,
        tags=occurrence_tags(last),
        param={"data": "x"},
        settled_at=1_501_000,
    )
    schedule = server.ok("schedule.get", {"id": "s"}, 1_501_000)["schedule"]
    assert (schedule["lastRunAt"], schedule["nextRunAt"]) == (1_501_000, 1_502_000)


def test_p22_targeted_occurrences_dispatch_only_live_ones(server: RunningServer) -> None:
    """§10.22 with §3: targeted occurrences get tasks; a backlogged one already past
    its deadline is born fulfilled-by-projection and never dispatched."""
    sched = {**SCHED, "promiseTimeout": 10_000, "promiseTags": {"k": "v", **TGT}}
    server.ok("schedule.create", sched, 1000)
    server.tick(35_000)
    assert get_task(server, "~s/s.10000", 35_000) == task_rec("~s/s.10000", "fulfilled", 0)
    assert get_task(server, "~s/s.20000", 35_000) == task_rec("~s/s.20000", "fulfilled", 0)
    assert get_task(server, "~s/s.30000", 35_000) == task_rec("~s/s.30000", "pending", 0)
    assert rows(server) == {"~s/s.30000": execute("~s/s.30000", 0, 35_000)}


def test_p22_schedule_doors(server: RunningServer) -> None:
    """troth's schedule doors (beyond §4.3, for the §5.3 calendar contract): invalid
    cron, '/' in the id, a template without {{.timestamp}} → 400 with a message."""
    bad = [
        {**SCHED, "cron": "*/10 * * *"},
        {**SCHED, "cron": "61 * * * * *"},
        {**SCHED, "id": "a/b"},
        {**SCHED, "promiseId": "{{.id}}"},
    ]
    for body in bad:
        status, data = server.call("schedule.create", body, 1000)
        assert status == 400, body
        assert isinstance(data, str) and data, body
    assert "cron" in server.call("schedule.create", bad[0], 1000)[1].lower()
    assert server.snap()["schedules"] == []


def test_p22_occurrence_ids_out_of_client_namespace(server: RunningServer) -> None:
    """§10.22 / §5.3: clients cannot create '~' ids (promise.create, task.create, a
    fence's inner create); a client id equal to the expanded template is not adopted."""
    status, _ = server.call("promise.create", {"id": "~s/s.10000", "timeoutAt": 99_000}, 1000)
    assert status == 400
    inner = action("promise.create", {"id": "~x", "timeoutAt": 99_000, "tags": TGT})
    assert server.call("task.create", {"pid": "w", "ttl": 10, "action": inner}, 1000)[0] == 400
    task_create(server, "f", 99_000, 1000)
    out = server.ok("task.fence", {"id": "f", "version": 1, "action": inner}, 1000)
    assert out["action"]["head"]["status"] == 400
    create(server, "s.10000", 99_000, 1000, {"mine": "yes"})
    server.ok("schedule.create", SCHED, 1000)
    server.tick(10_000)
    assert get_promise(server, "s.10000", 10_000)["tags"] == {"mine": "yes"}
    assert get_promise(server, "~s/s.10000", 10_000)["createdAt"] == 10_000


def test_p22_deleted_schedule_stops(server: RunningServer) -> None:
    """§4.3 S-03: a deleted schedule fires nothing more."""
    server.ok("schedule.create", SCHED, 1000)
    assert server.call("schedule.delete", {"id": "s"}, 2000) == (200, {})
    server.tick(50_000)
    assert server.snap()["promises"] == []
    assert server.call("schedule.get", {"id": "s"}, 50_000)[0] == 404


# -------------------------------------------------------------------------- 23. one clock


def test_p23_one_clock_reading_per_request(server: RunningServer) -> None:
    """§10.23: resonate:debug_time is the request's only instant: createdAt, the
    lease, the retry re-arm and the outbox row of the step it fired all use it, even
    far in the past (wall clock would make this promise born dead)."""
    assert create(server, "p", 3, 2, TGT) == record("p", "pending", 3, 2, tags=TGT)
    assert stored_task(server, "p")["retryAt"] == 2 + RETRY
    assert rows(server) == {"p": execute("p", 0, 2)}
    task_create(server, "a", 900, 7, ttl=11)
    assert stored_task(server, "a")["expiresAt"] == 18
    status, data = server.call("debug.tick", {"time": 100}, 99)
    assert (status, type(data)) == (400, str)


# ------------------------------------------------------------------------- 24. searches


def test_p24_search_promises_pages_in_id_order(server: RunningServer) -> None:
    """troth serves searches (SPEC §10.24 leaves them open): id order, limit, opaque
    cursor continuing after the last id; the last page carries no cursor."""
    for i in (3, 1, 2, *range(4, 26)):
        create(server, f"p{i:02d}", 99_000, 1000)
    seen: list[str] = []
    cursor: str | None = None
    sizes = []
    while True:
        body: dict[str, Any] = {"limit": 10}
        if cursor is not None:
            body["cursor"] = cursor
        page = server.ok("promise.search", body, 1000)
        sizes.append(len(page["promises"]))
        seen += [p["id"] for p in page["promises"]]
        cursor = page.get("cursor")
        if cursor is None:
            break
    assert sizes == [10, 10, 5]
    assert seen == [f"p{i:02d}" for i in range(1, 26)]


def test_p24_search_default_limit_and_cursor_after_last_id(server: RunningServer) -> None:
    """Default limit 100; the cursor continues strictly after the last id returned,
    so an id created later below it is skipped and one above it is found."""
    for i in range(105):
        create(server, f"p{i:03d}", 99_000, 1000)
    first = server.ok("promise.search", {}, 1000)
    assert [p["id"] for p in first["promises"]] == [f"p{i:03d}" for i in range(100)]
    create(server, "p050x", 99_000, 1000)
    create(server, "p200", 99_000, 1000)
    rest = server.ok("promise.search", {"cursor": first["cursor"]}, 1000)
    assert [p["id"] for p in rest["promises"]] == [*(f"p{i:03d}" for i in range(100, 105)), "p200"]
    assert "cursor" not in rest


def test_p24_search_filters_projected_state_and_tags(server: RunningServer) -> None:
    """State filters the projected view (a promise past its deadline is found under
    rejected_timedout, not pending); tags require every given pair."""
    create(server, "a", 5000, 1000, {"x": "1", "y": "2"})
    create(server, "b", 99_000, 1000, {"x": "1"})
    create(server, "c", 99_000, 1000, {"x": "2", "y": "2"})
    server.ok("promise.settle", {"id": "c", "state": "resolved"}, 1000)

    def ids(query: dict[str, Any]) -> list[str]:
        return [p["id"] for p in server.ok("promise.search", query, 6000)["promises"]]

    assert ids({"state": "rejected_timedout"}) == ["a"]
    assert ids({"state": "pending"}) == ["b"]
    assert ids({"state": "resolved"}) == ["c"]
    assert ids({"tags": {"x": "1"}}) == ["a", "b"]
    assert ids({"tags": {"x": "1", "y": "2"}}) == ["a"]
    assert ids({"tags": {"y": "2"}, "state": "resolved"}) == ["c"]
    found = server.ok("promise.search", {"state": "rejected_timedout"}, 6000)["promises"]
    assert found == [
        record("a", "rejected_timedout", 5000, 1000, tags={"x": "1", "y": "2"}, settled_at=5000)
    ]


def test_p24_search_timer_and_tag_values(server: RunningServer) -> None:
    """A timer past its deadline is found under ``resolved``; tag matching is exact
    on key and value, including characters a LIKE or JSON-path filter would mangle."""
    create(server, "t", 5000, 1000, {**TIMER, "k%": 'a"b'})
    create(server, "u", 99_000, 1000, {"k_": "a.b", "x": "%"})

    def ids(query: dict[str, Any]) -> list[str]:
        return [p["id"] for p in server.ok("promise.search", query, 6000)["promises"]]

    assert ids({"state": "resolved"}) == ["t"]
    assert ids({"state": "pending"}) == ["u"]
    assert ids({"tags": {"k%": 'a"b'}}) == ["t"]
    assert ids({"tags": {"k%": "a"}}) == []
    assert ids({"tags": {"k_": "a.b", "x": "%"}}) == ["u"]
    assert ids({"tags": {"k_": "a_b"}}) == []
    assert ids({"tags": {"x": "_"}}) == []


def test_p24_search_tasks_and_schedules(server: RunningServer) -> None:
    """Task search filters the viewed state; schedule search defaults to 10 a page."""
    task_create(server, "a", 5000, 1000)
    create(server, "b", 99_000, 1000, TGT)
    tasks = server.ok("task.search", {"state": "fulfilled"}, 6000)
    assert tasks == {"tasks": [task_rec("a", "fulfilled", 1)]}
    assert server.ok("task.search", {"state": "acquired"}, 6000) == {"tasks": []}
    assert server.ok("task.search", {"state": "pending"}, 6000) == {
        "tasks": [task_rec("b", "pending", 0)]
    }
    for i in range(12):
        server.ok("schedule.create", {**SCHED, "id": f"s{i:02d}"}, 1000)
    first = server.ok("schedule.search", {}, 1000)
    assert [s["id"] for s in first["schedules"]] == [f"s{i:02d}" for i in range(10)]
    rest = server.ok("schedule.search", {"cursor": first["cursor"]}, 1000)
    assert [s["id"] for s in rest["schedules"]] == ["s10", "s11"]


def test_p24_search_limit_out_of_range(server: RunningServer) -> None:
    """limit must be 1..1000 (400 otherwise), for every search."""
    for kind in ("promise.search", "task.search", "schedule.search"):
        for limit in (0, 1001):
            status, data = server.call(kind, {"limit": limit}, 1000)
            assert (status, type(data)) == (400, str), (kind, limit)
        assert server.call(kind, {"limit": 1000}, 1000)[0] == 200


# ------------------------------------------------------------------------ 25. wire details


def test_p25_wire_details(server: RunningServer) -> None:
    """§10.25: full camelCase records, snake-case state strings, resumes as a count,
    absent optional fields omitted, non-2xx data a plain string, envelope echoed."""
    r = server.raw("promise.create", {"id": "p", "timeoutAt": 9000, "tags": TGT}, 1000)
    assert r.status_code == 200
    body = r.json()
    assert body["kind"] == "promise.create"
    assert body["head"]["status"] == 200
    assert body["head"]["version"] == "2026-04-01"
    assert set(body["data"]["promise"]) == {
        "id",
        "state",
        "param",
        "value",
        "tags",
        "timeoutAt",
        "createdAt",
    }
    settled = server.ok("promise.settle", {"id": "p", "state": "rejected_canceled"}, 2000)[
        "promise"
    ]
    assert settled["state"] == "rejected_canceled"
    assert settled["settledAt"] == 2000
    assert get_task(server, "p", 2000) == {
        "id": "p",
        "state": "fulfilled",
        "version": 0,
        "resumes": 0,
    }
    r = server.raw("promise.get", {"id": "nope"}, 2000)
    assert r.status_code == 404
    assert r.json()["head"]["status"] == 404
    assert isinstance(r.json()["data"], str)
    task = task_create(server, "t", 9000, 2000, ttl=30)["task"]
    assert task == {
        "id": "t",
        "state": "acquired",
        "version": 1,
        "resumes": 0,
        "ttl": 30,
        "pid": "w1",
    }
