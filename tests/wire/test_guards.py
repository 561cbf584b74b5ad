"""Status and guard order of every request kind (SPEC.md §4, §10.6).

Guard order is observable and part of the protocol: validation (400) first, then
existence (404), then state/version (409) or semantic refusal (422).  Each test
makes two failures coincide where the spec fixes which one wins, and every refusal
goes through :func:`refused`, which also checks that the refused request changed
nothing (the whole ``debug.snap`` is equal before and after: promises with their
ledgers, tasks with their deadlines, schedules and outbox rows).
"""

from __future__ import annotations

from typing import Any

import pytest

from helpers.support import RunningServer
from helpers.wire import EXT, TGT, TIMER, action

CRON = "*/10 * * * * *"


def rc(awaited: str, awaiter: str = "x") -> dict[str, Any]:
    return action("promise.register_callback", {"awaited": awaited, "awaiter": awaiter})


def settle_action(id: str, state: str = "resolved") -> dict[str, Any]:
    return action("promise.settle", {"id": id, "state": state})


def create_action(
    id: str, tags: dict[str, str] | None = None, timeout_at: int = 99_000
) -> dict[str, Any]:
    return action("promise.create", {"id": id, "timeoutAt": timeout_at, "tags": tags or {}})


def refused(server: RunningServer, kind: str, data: dict[str, Any], now: int, status: int) -> str:
    """Send a request that must be refused with ``status``: ``data`` is a plain string
    (§10.25) and the store is unchanged."""
    before = server.snap()
    got, body = server.call(kind, data, now)
    assert (got, type(body)) == (status, str), (kind, data, got, body)
    assert server.snap() == before, (kind, data)
    message: str = body
    return message


def create(
    server: RunningServer, id: str, tags: dict[str, str] | None = None, timeout_at: int = 99_000
) -> None:
    server.ok("promise.create", {"id": id, "timeoutAt": timeout_at, "tags": tags or {}}, 1000)


def task_create(
    server: RunningServer, id: str, timeout_at: int = 99_000, ttl: int = 60_000
) -> None:
    body = {"pid": "w1", "ttl": ttl, "action": create_action(id, TGT, timeout_at)}
    server.ok("task.create", body, 1000)


@pytest.fixture
def world(server: RunningServer) -> RunningServer:
    """A store with one object in every interesting state (all created at 1000):

    * ``ext`` pending external, ``int`` pending internal, ``done`` resolved external,
      ``idone`` resolved internal, ``dying`` external that times out at 5000;
    * tasks ``acq`` (acquired v1), ``pen`` (pending v0), ``sus`` (suspended v1 on
      ``ext``), ``hal`` (halted v1), ``ful`` (fulfilled v1), ``dead`` (acquired v1
      whose promise times out at 5000);
    * schedule ``s``.
    """
    create(server, "ext", EXT)
    create(server, "int")
    create(server, "done", EXT)
    create(server, "idone")
    create(server, "dying", EXT, 5000)
    server.ok("promise.settle", {"id": "done", "state": "resolved"}, 1000)
    server.ok("promise.settle", {"id": "idone", "state": "resolved"}, 1000)
    for id in ("acq", "sus", "hal", "ful"):
        task_create(server, id)
    task_create(server, "dead", 5000)
    create(server, "pen", TGT)
    server.ok("task.suspend", {"id": "sus", "version": 1, "actions": [rc("ext", "sus")]}, 1000)
    server.ok("task.halt", {"id": "hal"}, 1000)
    server.ok("task.fulfill", {"id": "ful", "version": 1, "action": settle_action("ful")}, 1000)
    sched = {"id": "s", "cron": CRON, "promiseId": "{{.timestamp}}", "promiseTimeout": 1000}
    server.ok("schedule.create", sched, 1000)
    return server


# ------------------------------------------------------------------------- promise.get


def test_promise_get_missing(world: RunningServer) -> None:
    """P-01: absent → 404."""
    refused(world, "promise.get", {"id": "nope"}, 2000, 404)


# ---------------------------------------------------------------------- promise.create


@pytest.mark.parametrize("id", ["nope", "ext", "acq"])
def test_promise_create_timer_target_before_lookup(world: RunningServer, id: str) -> None:
    """P-02.1: timer + target → 400 before lookup, so also for an existing id (which
    would otherwise answer 200 with the existing record)."""
    data = {"id": id, "timeoutAt": 99_000, "tags": {**TIMER, **TGT}}
    refused(world, "promise.create", data, 2000, 400)


def test_promise_create_reserved_id(world: RunningServer) -> None:
    """troth door (§5.3): '~' ids belong to schedule occurrences → 400, whatever the
    timeout (a born-dead one too)."""
    refused(world, "promise.create", {"id": "~s/1", "timeoutAt": 99_000}, 2000, 400)
    refused(world, "promise.create", {"id": "~x", "timeoutAt": 1}, 2000, 400)


# ---------------------------------------------------------------------- promise.settle


@pytest.mark.parametrize("state", ["pending", "rejected_timedout", "bogus"])
@pytest.mark.parametrize("id", ["nope", "ext", "done"])
def test_promise_settle_state_before_lookup(world: RunningServer, state: str, id: str) -> None:
    """P-03.1: a state that is not settable → 400 before lookup (missing, pending and
    settled alike)."""
    refused(world, "promise.settle", {"id": id, "state": state}, 2000, 400)


def test_promise_settle_missing(world: RunningServer) -> None:
    """P-03.2: absent → 404."""
    refused(world, "promise.settle", {"id": "nope", "state": "resolved"}, 2000, 404)


# ----------------------------------------------------------- promise.register_callback


@pytest.mark.parametrize(
    ("awaited", "awaiter", "status"),
    [
        ("nope", "nope", 400),  # self-await beats missing
        ("ext", "ext", 400),
        ("nope", "nope2", 404),  # awaited missing beats awaiter missing
        ("nope", "acq", 404),
        ("nope", "int", 404),
        ("ext", "nope", 422),  # awaiter missing is 422, not 404
        ("int", "nope", 422),
        ("ext", "int", 422),  # awaiter not targeted
        ("ext", "ext2", 422),
        ("done", "int", 422),  # refusals beat "settled → 200"
        ("int", "acq", 422),  # awaited not external
        ("idone", "acq", 422),
    ],
)
def test_register_callback_guards(
    world: RunningServer, awaited: str, awaiter: str, status: int
) -> None:
    """P-04: 400 self → 404 awaited → 422 awaiter missing / untargeted → 422 awaited
    internal, all before the pending/settled branch (§10.13)."""
    create(world, "ext2", EXT)
    data = {"awaited": awaited, "awaiter": awaiter}
    refused(world, "promise.register_callback", data, 2000, status)


# ----------------------------------------------------------- promise.register_listener


@pytest.mark.parametrize("address", ["tcp://x", "poll://nogroup", "", "HTTP://x", "x http://y"])
@pytest.mark.parametrize("awaited", ["nope", "int", "ext", "done"])
def test_register_listener_address_before_lookup(
    world: RunningServer, address: str, awaited: str
) -> None:
    """P-05.1 / §10.6: an undeliverable address → 400 before lookup, even on a missing
    or internal promise (§2.3 addressValid: http://, https://, or poll://…@…)."""
    data = {"awaited": awaited, "address": address}
    refused(world, "promise.register_listener", data, 2000, 400)


@pytest.mark.parametrize(("awaited", "status"), [("nope", 404), ("int", 422), ("idone", 422)])
def test_register_listener_existence_then_external(
    world: RunningServer, awaited: str, status: int
) -> None:
    """P-05.2–3: absent → 404; not external → 422 (even when settled, C3)."""
    data = {"awaited": awaited, "address": "http://l"}
    refused(world, "promise.register_listener", data, 2000, status)


# ---------------------------------------------------------------------------- task.get


@pytest.mark.parametrize("id", ["nope", "ext", "int"])
def test_task_get_missing(world: RunningServer, id: str) -> None:
    """T-01: no task (also for a promise without a task) → 404."""
    refused(world, "task.get", {"id": id}, 2000, 404)


# ------------------------------------------------------------------------- task.create


@pytest.mark.parametrize("id", ["nope", "acq", "ext", "ful"])
@pytest.mark.parametrize("tags", [{}, EXT, {**TIMER, **TGT}, {"resonate:target2": "x"}])
def test_task_create_validation_before_lookup(
    world: RunningServer, id: str, tags: dict[str, str]
) -> None:
    """T-02.1: no resonate:target, or timer + target → 400 before lookup, also for
    existing ids (acquired → would be 409, untargeted → 422, fulfilled → 200)."""
    body = {"pid": "w1", "ttl": 100, "action": create_action(id, tags)}
    refused(world, "task.create", body, 2000, 400)


@pytest.mark.parametrize(("id", "status"), [("ext", 422), ("int", 422), ("done", 422)])
def test_task_create_untargeted_existing(world: RunningServer, id: str, status: int) -> None:
    """T-02.4: the promise exists but is not targeted → 422 (even when settled)."""
    body = {"pid": "w1", "ttl": 100, "action": create_action(id, TGT)}
    refused(world, "task.create", body, 2000, status)


@pytest.mark.parametrize("id", ["acq", "sus", "hal"])
@pytest.mark.parametrize("pid", ["w1", "w2"])
def test_task_create_busy(world: RunningServer, id: str, pid: str) -> None:
    """T-02.8: acquired / suspended / halted → 409, even for the holder's pid."""
    body = {"pid": pid, "ttl": 100, "action": create_action(id, TGT)}
    refused(world, "task.create", body, 2000, 409)


# ------------------------------------------------------------------------ task.acquire


@pytest.mark.parametrize(
    ("id", "version", "now", "status"),
    [
        ("nope", 0, 2000, 404),
        ("ext", 0, 2000, 404),  # a promise without a task
        ("pen", 1, 2000, 409),  # version mismatch
        ("acq", 1, 2000, 409),  # not pending
        ("sus", 1, 2000, 409),
        ("hal", 1, 2000, 409),
        ("ful", 1, 2000, 409),
        ("dead", 1, 5000, 409),  # viewed fulfilled
    ],
)
def test_task_acquire_guards(
    world: RunningServer, id: str, version: int, now: int, status: int
) -> None:
    """T-03: 404 → 409 (state of the view, promise pending, version)."""
    body = {"id": id, "version": version, "pid": "w2", "ttl": 100}
    refused(world, "task.acquire", body, now, status)


def test_task_acquire_pending_task_of_dead_promise(server: RunningServer) -> None:
    """T-03 / §10.1: a pending task whose promise timed out → 409 at the right version."""
    create(server, "p", TGT, 5000)
    refused(server, "task.acquire", {"id": "p", "version": 0, "pid": "w", "ttl": 10}, 5000, 409)


# -------------------------------------------------------------------------- task.fence


@pytest.mark.parametrize(
    ("id", "version", "inner"),
    [
        ("nope", 1, settle_action("nope")),  # own promise beats missing task
        ("acq", 1, settle_action("acq")),
        ("acq", 7, settle_action("acq")),  # beats version mismatch
        ("pen", 0, create_action("pen", TGT)),  # beats not acquired
        ("acq", 1, create_action("acq")),
    ],
)
def test_task_fence_own_promise_first(
    world: RunningServer, id: str, version: int, inner: dict[str, Any]
) -> None:
    """T-04.1: a fence on the task's own promise → 400 before any lookup."""
    refused(world, "task.fence", {"id": id, "version": version, "action": inner}, 2000, 400)


@pytest.mark.parametrize(
    ("id", "version", "now", "status"),
    [
        ("nope", 1, 2000, 404),
        ("ext", 1, 2000, 404),
        ("pen", 0, 2000, 409),
        ("sus", 1, 2000, 409),
        ("hal", 1, 2000, 409),
        ("ful", 1, 2000, 409),
        ("acq", 2, 2000, 409),
        ("dead", 1, 5000, 409),
    ],
)
@pytest.mark.parametrize("inner", ["valid", "invalid"])
def test_task_fence_outer_guards_before_inner(
    world: RunningServer, id: str, version: int, now: int, status: int, inner: str
) -> None:
    """T-04.2–3: the outer 404/409 come before the inner handler runs, so an inner
    request that would itself be refused (settle ``pending``) does not change them."""
    act = settle_action("int", "resolved" if inner == "valid" else "pending")
    refused(world, "task.fence", {"id": id, "version": version, "action": act}, now, status)


@pytest.mark.parametrize(
    ("inner", "status"),
    [
        (settle_action("ext", "pending"), 400),
        (settle_action("ext", "rejected_timedout"), 400),
        (settle_action("nope"), 404),
        (create_action("~p"), 400),
    ],
)
def test_task_fence_inner_refusal_is_wrapped(
    world: RunningServer, inner: dict[str, Any], status: int
) -> None:
    """T-04.3: when the fence holds the outer status is 200 and the inner refusal is
    reported in ``action`` (status + plain-string data); nothing changes."""
    before = world.snap()
    out = world.ok("task.fence", {"id": "acq", "version": 1, "action": inner}, 2000)
    assert out["action"]["kind"] == inner["kind"]
    assert out["action"]["head"]["status"] == status
    assert isinstance(out["action"]["data"], str)
    assert out["preload"] == []
    assert world.snap() == before


# ---------------------------------------------------------------------- task.heartbeat


def test_task_heartbeat_never_refuses(world: RunningServer) -> None:
    """T-05: always 200; mismatching refs are skipped silently and change nothing."""
    refs = [
        {"id": "nope", "version": 1},
        {"id": "acq", "version": 2},
        {"id": "pen", "version": 0},
        {"id": "sus", "version": 1},
        {"id": "dead", "version": 1},
    ]
    before = world.snap()
    assert world.call("task.heartbeat", {"pid": "w1", "tasks": refs}, 5000) == (200, {})
    assert world.call(
        "task.heartbeat", {"pid": "w2", "tasks": [{"id": "acq", "version": 1}]}, 5000
    ) == (200, {})
    assert world.snap() == before


# ------------------------------------------------------------------------ task.suspend


@pytest.mark.parametrize(
    ("id", "version", "actions"),
    [
        ("nope", 1, []),  # empty beats missing
        ("acq", 1, []),
        ("pen", 5, []),
        ("nope", 1, [rc("nope")]),  # self-await beats missing
        ("acq", 1, [rc("ext"), rc("acq")]),
        ("acq", 9, [rc("nope"), rc("acq")]),  # beats version mismatch and missing awaited
        ("nope", 1, [rc("ext"), rc("ext")]),  # duplicate beats missing
        ("acq", 1, [rc("done"), rc("ext"), rc("done")]),  # beats 300
        ("hal", 1, [rc("x1"), rc("x1")]),  # beats not acquired
    ],
)
def test_task_suspend_validation_before_lookup(
    world: RunningServer, id: str, version: int, actions: list[dict[str, Any]]
) -> None:
    """T-06.1: empty actions, self-await, duplicate awaited → 400 before any lookup."""
    refused(world, "task.suspend", {"id": id, "version": version, "actions": actions}, 2000, 400)


@pytest.mark.parametrize(
    ("id", "version", "now", "status"),
    [
        ("nope", 1, 2000, 404),
        ("ext", 1, 2000, 404),
        ("pen", 0, 2000, 409),
        ("sus", 1, 2000, 409),
        ("hal", 1, 2000, 409),
        ("ful", 1, 2000, 409),
        ("acq", 2, 2000, 409),
        ("dead", 1, 5000, 409),
    ],
)
@pytest.mark.parametrize("awaited", ["dying", "gone", "done", "int"])
def test_task_suspend_task_guards_before_awaited(
    world: RunningServer, id: str, version: int, now: int, status: int, awaited: str
) -> None:
    """T-06.2: the task's 404/409 come before the awaited checks (422) and 300."""
    body = {"id": id, "version": version, "actions": [rc(awaited, id)]}
    refused(world, "task.suspend", body, now, status)


@pytest.mark.parametrize(
    "awaited",
    [
        ["nope"],
        ["int"],
        ["done", "nope"],
        ["nope", "done"],
        ["ext", "done", "int"],
        ["int", "ext", "done"],
        ["idone"],
        ["dying", "nope"],
    ],
)
def test_task_suspend_422_beats_300(world: RunningServer, awaited: list[str]) -> None:
    """T-06.3 / §10.12: any missing or internal awaited → 422, wherever it appears,
    even when another awaited is settled (300) or pending (200)."""
    body = {"id": "acq", "version": 1, "actions": [rc(x, "acq") for x in awaited]}
    refused(world, "task.suspend", body, 5000, 422)


# ------------------------------------------------------------------------ task.fulfill


@pytest.mark.parametrize("state", ["pending", "rejected_timedout", "bogus"])
@pytest.mark.parametrize(
    ("id", "version"), [("nope", 1), ("acq", 1), ("acq", 3), ("pen", 0), ("ful", 1)]
)
def test_task_fulfill_state_before_lookup(
    world: RunningServer, state: str, id: str, version: int
) -> None:
    """T-07.1: an action state that is not settable → 400 before any lookup."""
    body = {"id": id, "version": version, "action": settle_action(id, state)}
    refused(world, "task.fulfill", body, 2000, 400)


@pytest.mark.parametrize(
    ("id", "version", "now", "status"),
    [
        ("nope", 1, 2000, 404),
        ("ext", 1, 2000, 404),
        ("pen", 0, 2000, 409),
        ("sus", 1, 2000, 409),
        ("hal", 1, 2000, 409),
        ("ful", 1, 2000, 409),
        ("acq", 0, 2000, 409),
        ("dead", 1, 5000, 409),
    ],
)
def test_task_fulfill_guards(
    world: RunningServer, id: str, version: int, now: int, status: int
) -> None:
    """T-07.2: 404 → 409 (state, dead promise, version)."""
    body = {"id": id, "version": version, "action": settle_action(id)}
    refused(world, "task.fulfill", body, now, status)


# ------------------------------------------------------------------------ task.release


@pytest.mark.parametrize(
    ("id", "version", "now", "status"),
    [
        ("nope", 1, 2000, 404),
        ("ext", 1, 2000, 404),
        ("pen", 0, 2000, 409),
        ("sus", 1, 2000, 409),
        ("hal", 1, 2000, 409),
        ("ful", 1, 2000, 409),
        ("acq", 2, 2000, 409),
        ("dead", 1, 5000, 409),
    ],
)
def test_task_release_guards(
    world: RunningServer, id: str, version: int, now: int, status: int
) -> None:
    """T-08.1: 404 → 409 (state, dead promise, version); no pid in the request."""
    refused(world, "task.release", {"id": id, "version": version}, now, status)


# --------------------------------------------------------------------------- task.halt


@pytest.mark.parametrize(
    ("id", "now", "status"),
    [("nope", 2000, 404), ("ext", 2000, 404), ("ful", 2000, 409), ("dead", 5000, 409)],
)
def test_task_halt_guards(world: RunningServer, id: str, now: int, status: int) -> None:
    """T-09: 404; fulfilled (also by projection) → 409."""
    refused(world, "task.halt", {"id": id}, now, status)


def test_task_halt_idempotent_changes_nothing(world: RunningServer) -> None:
    """T-09.3: halting a halted task is 200 and writes nothing."""
    before = world.snap()
    assert world.call("task.halt", {"id": "hal"}, 2000) == (200, {})
    assert world.snap() == before


# ----------------------------------------------------------------------- task.continue


@pytest.mark.parametrize(
    ("id", "now", "status"),
    [
        ("nope", 2000, 404),
        ("ext", 2000, 404),
        ("pen", 2000, 409),
        ("acq", 2000, 409),
        ("sus", 2000, 409),
        ("ful", 2000, 409),
        ("dead", 5000, 409),
    ],
)
def test_task_continue_guards(world: RunningServer, id: str, now: int, status: int) -> None:
    """T-10: 404 → 409 not halted.  The spec checks "halted" before "promise
    missing", but a task without its promise is unreachable over the protocol, so the
    order is pinned by what is reachable: the state check reads the view."""
    refused(world, "task.continue", {"id": id}, now, status)


def test_task_continue_halted_with_dead_promise(server: RunningServer) -> None:
    """T-10.2–3: a halted task whose promise timed out reads as fulfilled → 409."""
    task_create(server, "h", 5000)
    server.ok("task.halt", {"id": "h"}, 2000)
    refused(server, "task.continue", {"id": "h"}, 5000, 409)


# --------------------------------------------------------------------------- schedules


def test_schedule_get_and_delete_missing(world: RunningServer) -> None:
    """S-01 / S-03: absent → 404."""
    refused(world, "schedule.get", {"id": "nope"}, 2000, 404)
    refused(world, "schedule.delete", {"id": "nope"}, 2000, 404)


@pytest.mark.parametrize("id", ["new", "s"])
@pytest.mark.parametrize(
    "change",
    [
        {"promiseTags": {**TIMER, **TGT}},  # S-02.1
        {"cron": "not a cron"},  # troth doors beyond §4.3
        {"cron": "* * * *"},
        {"promiseId": "{{.id}}"},
    ],
)
def test_schedule_create_validation_before_lookup(
    world: RunningServer, id: str, change: dict[str, Any]
) -> None:
    """S-02.1: validation → 400 before the existing-id answer (200 with the stored
    schedule); troth adds cron and template checks at the same door."""
    body = {"id": id, "cron": CRON, "promiseId": "{{.timestamp}}", "promiseTimeout": 1000, **change}
    refused(world, "schedule.create", body, 2000, 400)


def test_schedule_create_id_with_slash(world: RunningServer) -> None:
    """troth door: '/' would make ``~{id}/…`` occurrence ids ambiguous (§5.3)."""
    body = {"id": "a/b", "cron": CRON, "promiseId": "{{.timestamp}}", "promiseTimeout": 1000}
    refused(world, "schedule.create", body, 2000, 400)


# ---------------------------------------------------------------------------- searches


@pytest.mark.parametrize("kind", ["promise.search", "task.search", "schedule.search"])
@pytest.mark.parametrize("limit", [0, -1, 1001])
def test_search_limit_out_of_range(world: RunningServer, kind: str, limit: int) -> None:
    """troth's searches (§10.24 leaves them to us): limit outside 1..1000 → 400."""
    refused(world, kind, {"limit": limit}, 2000, 400)


@pytest.mark.parametrize(
    ("kind", "state"), [("promise.search", "done"), ("task.search", "running")]
)
def test_search_unknown_state(world: RunningServer, kind: str, state: str) -> None:
    """An unknown state filter → 400 (not an empty page)."""
    refused(world, kind, {"state": state}, 2000, 400)
