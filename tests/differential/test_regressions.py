"""Every divergence the differential tests found, as a named, replayable test.

Each script is the shrunk failing script ``test_differential.py`` printed (tidied by
hand), replayed with :func:`model.mapping.replay` on every backend: troth's answers
and store must equal the model's after every step, and the catalogue must hold.
Each docstring says what diverged, what SPEC.md (or docs/protocol.md, where the
specification leaves the choice to troth) says, and whose bug it was.

* **troth bugs** — the test failed until troth was fixed;
* **model bugs** — the model misread troth's documented choices; fixed in the model,
  the test keeps the two in step;
* **specification findings** — a catalogue entry that the specification's own machine
  breaks; recorded in ``model.properties.SPEC_FINDINGS``.
"""

from __future__ import annotations

from typing import Any

import pytest

from model import machine as m
from model.mapping import replay
from model.properties import SPEC_FINDINGS, trans_failures

TGT = {"resonate:target": "poll://any@w"}
BRANCH = {**TGT, "resonate:branch": "br"}
EXT = {"resonate:external": "true"}


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def create(id: str, timeout_at: int, tags: dict[str, str]) -> dict[str, Any]:
    return {"id": id, "timeoutAt": timeout_at, "tags": tags}


def action(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "head": {}, "data": data}


def task_create(id: str, ttl: int, tags: dict[str, str], timeout_at: int = 21_000) -> Any:
    return (
        "task.create",
        {"pid": "w1", "ttl": ttl, "action": action("promise.create", create(id, timeout_at, tags))},
    )


def suspend(id: str, version: int, *awaited: str) -> Any:
    actions = [action("promise.register_callback", {"awaited": a, "awaiter": id}) for a in awaited]
    return ("task.suspend", {"id": id, "version": version, "actions": actions})


# ---------------------------------------------------------------------- troth bugs


def test_fence_preload_includes_the_sibling_it_created(store: str) -> None:
    """troth bug, fixed in 0a97875.  A ``task.fence`` answer's ``preload`` (troth's
    extension, docs/protocol.md "preload": the other promises of the task's
    ``resonate:branch``) was read from neither the state before the fence nor the
    state after it: it showed a sibling the fence *settled* as settled, but omitted a
    sibling the fence *created*.  Expected (the model): the state after the fence's
    writes, so ``c`` is listed; troth answered ``preload == []`` on both backends.
    Now a fence's ``preload`` is always ``[]`` (docs/protocol.md
    "preload"), in troth and in the model; the script stays as a fenced create of a
    branch sibling that both must answer alike."""
    replay(
        store,
        [
            task_create("a", 60_000, BRANCH),
            (
                "task.fence",
                {
                    "id": "a",
                    "version": 1,
                    "action": action("promise.create", create("c", 21_000, BRANCH)),
                },
            ),
        ],
    )


# ------------------------------------------------------- flow control's priority range
#
# Found by the flow-control scripts (``FlowMachine``), fixed: a priority beyond a
# 32-bit integer counts as its bound, on every store.

#: A ``troth:priority`` the store's ``flow_held.priority`` column cannot hold, by
#: backend: PostgreSQL's ``INTEGER`` is 32 bits, SQLite's 64; memory holds any.
TOO_BIG = {"postgres": "3000000000", "sqlite": "99999999999999999999"}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_held_task_with_a_huge_priority_is_created(backend: str) -> None:
    """Was a bug (fixed).  docs/operations.md ("Flow control"): ``troth:priority`` is
    "an integer as a string", bounded at ±(2**31 - 1), and a task beyond the limit is
    held.
    Under a concurrency limit of 1 with its slot taken, creating ``b`` with
    ``troth:priority`` 3000000000 (PostgreSQL; 10**20 on SQLite) must answer 200 and
    hold ``b``.  troth answered **500**: the held row's priority overflowed the
    ``flow_held.priority`` column (PostgreSQL ``integer out of range``, SQLite
    ``OverflowError``), so the promise could not be created while its group was full."""
    replay(
        backend,
        [
            ("limit", {"group": "w", "concurrency": 1}),
            task_create("a", 60_000, TGT),
            ("promise.create", create("b", 21_000, {**TGT, "troth:priority": TOO_BIG[backend]})),
        ],
    )


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_huge_priority_does_not_stall_the_timer(backend: str) -> None:
    """Was a bug (fixed), the worse face of the one above: the timer.  ``b`` (priority
    -3000000000; -10**20 on SQLite) is let through while the slot is free, so no held
    row is written; a worker takes it with a 100 ms lease; ``c`` is held; an unrelated
    external promise ``x`` times out at 2000.  At the tick at 2000 ``b``'s lease
    expires, ``b`` goes back to the queue *behind* ``c`` (lower priority), ``c`` is let
    through, and ``b``'s held row is written — which overflows the column.  Expected
    (the model): the tick persists ``x``'s timeout, re-pends ``b`` (held) and sends
    ``c``'s ``execute``.  troth failed the whole timer pass (``debug.tick`` 500): ``x``
    stayed pending, ``b`` acquired, ``c`` got nothing — and every later pass met the
    same expired lease first, so the timer failed on every pass until ``b``'s promise
    was settled by a request."""
    big = "-" + TOO_BIG[backend]
    replay(
        backend,
        [
            ("limit", {"group": "w", "concurrency": 1}),
            ("promise.create", create("b", 60_000, {**TGT, "troth:priority": big})),
            ("task.acquire", {"id": "b", "version": 0, "pid": "w1", "ttl": 100}),
            ("promise.create", create("c", 60_000, TGT)),
            ("promise.create", create("x", 2000, EXT)),
            ("advance", 1000),
            ("tick", None),
        ],
    )


# ---------------------------------------------------------------------- model bugs


def test_lease_granted_with_ttl_zero_expires_in_the_same_transaction(store: str) -> None:
    """Model bug.  docs/protocol.md ("Known gaps") says a ``ttl = 0`` lease is re-pended
    by "the next timer pass"; troth actually expires it (r5) and re-dispatches it (r6)
    inside the granting request's transaction — as its "Internal steps fire at once"
    rule says for every step a request enables.  Both are legal schedules (SPEC.md §1:
    internal steps fire at any time); the model follows troth.  The sentence in
    docs/protocol.md is inaccurate."""
    replay(store, [task_create("a", 0, TGT)])


def test_due_step_on_a_row_the_request_did_not_write_waits_for_the_timer(store: str) -> None:
    """Model bug.  A task whose ``retryAt`` passed without a tick is not dispatched
    when a request writes only its *promise* (a listener): troth fires in a request's
    transaction the steps enabled on the rows it wrote (here the promise row: r3/r4
    are not enabled), and leaves deadline steps on other rows to the timer."""
    replay(
        store,
        [
            ("promise.create", create("a", 21_000, TGT)),
            ("advance", 5001),
            ("promise.register_listener", {"awaited": "a", "address": "http://l.example/1"}),
            ("tick", None),
        ],
    )


def test_due_step_on_a_task_the_request_rewrote_fires_at_once(store: str) -> None:
    """Model bug.  The converse: a pending task with an overdue ``retryAt`` that a
    request re-acquires with ``ttl = 0`` is re-pended (r5) and dispatched at its new
    version (r6) in the same transaction, because the request wrote the task row."""
    replay(
        store,
        [
            ("promise.create", create("a", 21_000, TGT)),
            ("advance", 5003),
            task_create("a", 0, TGT, timeout_at=26_003),
        ],
    )


def test_preload_of_a_new_task_uses_the_new_promises_branch(store: str) -> None:
    """Model bug.  ``task.create`` of a new id answers the branch of the promise it
    just created (docs/protocol.md "preload"); the model had read the branch from the
    state before the request, where the promise does not exist yet."""
    replay(store, [task_create("a", 5000, BRANCH), task_create("b", 5000, BRANCH)])


def test_preload_of_a_fence_shows_the_sibling_it_settled(store: str) -> None:
    """Model bug.  A fence that settles a sibling answered it settled in ``preload``
    (the state after its writes); the model had read the state before.  Now
    a fence's ``preload`` is always ``[]`` (docs/protocol.md "preload"); the script
    stays as a fenced settle of a branch sibling that both must answer alike."""
    replay(
        store,
        [
            task_create("a", 5000, BRANCH),
            ("promise.create", create("b", 21_000, BRANCH)),
            (
                "task.fence",
                {
                    "id": "a",
                    "version": 1,
                    "action": action(
                        "promise.settle", {"id": "b", "state": "resolved", "value": {}}
                    ),
                },
            ),
        ],
    )


def test_timer_times_out_an_internal_occurrence_born_past_its_deadline(store: str) -> None:
    """Model bug.  troth's timer skips r1 on internal promises (docs/protocol.md "Reads
    are projected"), but a tick's own writes enable steps too: an untargeted schedule
    occurrence created by r7's catch-up already past its deadline is timed out by r1
    in the same tick.  Legal (r1 may fire at any time); the model follows troth."""
    replay(
        store,
        [
            ("advance", 5000),
            (
                "schedule.create",
                {
                    "id": "s",
                    "cron": "*/10 * * * * *",
                    "promiseId": "{{.timestamp}}",
                    "promiseTimeout": 5000,
                    "promiseParam": {"data": "p"},
                    "promiseTags": {},
                },
            ),
            ("advance", 10_000),
            ("tick", None),
            ("promise.get", {"id": "~s/10000"}),
        ],
    )


def test_two_wakes_in_one_tick_may_be_recorded_in_either_order(store: str) -> None:
    """Model bug (comparison).  A task suspended on two promises that time out at the
    same tick is resumed by one and buffers the other: ``resumes`` is ``[b, c]`` or
    ``[c, b]`` depending on which callback drain fires first — the specification
    leaves the order of internal steps open (latitude L7), and the wire shows only a
    count.  troth drains ``c`` first; the comparison ignores the order."""
    replay(
        store,
        [
            ("promise.create", create("c", 1100, EXT)),
            task_create("a", 60_000, TGT),
            ("promise.create", create("b", 1200, TGT)),
            suspend("a", 1, "b", "c"),
            ("advance", 1000),
            ("tick", None),
            ("task.get", {"id": "a"}),
        ],
    )


def test_occurrences_queued_in_one_tick_take_turns_first_created(store: str) -> None:
    """Model bug (found by the flow scripts).  Under a concurrency limit, one tick
    creates three schedule occurrences (``~s/80000``, ``~s/90000``, ``~s/100000``,
    each created at its own instant) and times out the task holding the slot; all
    three are queued in that pass, with one key.  The model gave them their turns in
    id order, so ``~s/100000`` got the slot; troth queues them first created, first
    queued (docs/operations.md "Flow control": "then first created"), so
    ``~s/80000`` gets it.  The model now queues a job's tasks in creation order."""
    replay(
        store,
        [
            ("limit", {"group": "w", "concurrency": 1}),
            task_create("a", 60_000, TGT),
            ("promise.create", create("b", 41_000, TGT)),
            ("advance", 70_000),
            (
                "schedule.create",
                {
                    "id": "s",
                    "cron": "*/10 * * * * *",
                    "promiseId": "{{.timestamp}}",
                    "promiseTimeout": 60_000,
                    "promiseParam": {"data": "p"},
                    "promiseTags": TGT,
                },
            ),
            ("advance", 30_000),
            ("tick", None),
        ],
    )


# ---------------------------------------------------------------------- specification findings


def test_finding_suspension_need_not_register_a_new_callback(store: str) -> None:
    """Specification finding.  ``consistent_suspension_registers_callback`` (§6.2 #72)
    wants a task entering ``suspended`` to have gained a *new* callback, but P-04
    accepts an awaiter whose task is still acquired, so the callback can already be
    there when the task suspends on that promise: T-06 adds nothing (deduplicated).
    troth and the model agree; the run keeps the weaker claim (a pending promise holds
    the callback).  Four steps: beyond the specification's length-3 sweeps."""
    script = [
        ("promise.create", create("b", 41_000, TGT)),
        task_create("a", 5000, TGT),
        ("promise.register_callback", {"awaited": "b", "awaiter": "a"}),
        suspend("a", 1, "b"),
    ]
    replay(store, script)
    state, steps = m.State(), []
    for kind, data in script:
        _, chain = m.after_request(state, kind, data, 1000)
        steps += [(state, tr.state) for tr in chain]
        state = chain[-1].state
    name = "consistent_suspension_registers_callback"
    broken = [(a, b) for a, b in steps if name in trans_failures(1000, a, b)]
    assert len(broken) == 1 and SPEC_FINDINGS[name](1000, *broken[0])


def test_finding_backlogged_occurrence_is_born_with_a_pending_task(store: str) -> None:
    """Specification finding.  ``preserved_no_dead_dispatch`` (§6.2 #85) fails on r7:
    the catch-up creates each missed occurrence as if at its own instant, so a
    targeted occurrence whose deadline has passed is born with a pending task while
    its promise already reads dead.  Nothing is dispatched (r1 fires first); the
    specification's sweeps never reach schedules (§6.5)."""
    sched = {
        "id": "s",
        "cron": "*/10 * * * * *",
        "promiseId": "{{.timestamp}}",
        "promiseTimeout": 3000,
        "promiseParam": {},
        "promiseTags": TGT,
    }
    replay(store, [("schedule.create", sched), ("advance", 30_000), ("tick", None)])
    created = m.handle(m.State(), "schedule.create", sched, 1000)[1]
    after = m.fire(created, ("r7", "s"), 31_000)
    name = "preserved_no_dead_dispatch"
    assert name in trans_failures(31_000, created, after)
    assert SPEC_FINDINGS[name](31_000, created, after)
