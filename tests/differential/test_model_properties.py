"""The property catalogue itself (SPEC.md §6), its map onto troth, and the §6.3 gaps.

A property that cannot fail is not being checked, so, as the specification's own
``stage1_all_falsifiable`` / ``stage3_all_falsifiable`` do, every one of the 95
entries (and the two provenance checks and three known gaps) is shown a hand-built
violator and must reject it — and must accept a baseline run of the model that goes
through every task state.  The differential tests (test_differential.py) then run the
catalogue against troth's real stores after every step.

The known gaps (§6.3) are not in the catalogue because the specification's machine
reaches them.  troth accepts them too (docs/protocol.md "Known gaps"); the tests here
pin down what that looks like in troth's store, over HTTP, on both backends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from helpers.support import RunningServer
from model import machine as m
from model.machine import (
    ACQUIRED,
    EMPTY,
    FULFILLED,
    HALTED,
    PENDING,
    REJECTED,
    REJECTED_TIMEDOUT,
    RESOLVED,
    SUSPENDED,
    Entry,
    Execute,
    Promise,
    Schedule,
    State,
    Task,
    Unblock,
    Value,
)
from model.mapping import from_snap
from model.properties import (
    INTERNAL_PROPERTIES,
    KNOWN_GAPS,
    STATE_PROPERTIES,
    TRANS_PROPERTIES,
    state_failures,
    trans_failures,
    well_formed_config_retry_positive,
)
from troth.server.config import ConfigError, Settings

TGT = {"resonate:target": "poll://any@w"}
EXT = {"resonate:external": "true"}
X = Value(data="x")


def P(id: str = "p", state: str = PENDING, **kw: Any) -> Promise:
    """A promise, live by default (created 1000, deadline 10 000)."""
    fields: dict[str, Any] = {
        "param": EMPTY,
        "value": EMPTY,
        "tags": {},
        "timeout_at": 10_000,
        "created_at": 1000,
    }
    if state != PENDING:
        fields["settled_at"] = 2000
    fields.update(kw)
    return Promise(id, state, **fields)


def T(id: str = "p", state: str = PENDING, version: int = 0, **kw: Any) -> Task:
    """A task in a well-formed shape for its state unless ``kw`` says otherwise."""
    shape: dict[str, Any] = {
        PENDING: {"retry_at": 1000},
        ACQUIRED: {"pid": "w", "ttl": 100, "expires_at": 1100},
    }.get(state, {})
    return Task(id, state, version, **{**shape, **kw})


def C(**kw: Any) -> Schedule:
    fields: dict[str, Any] = {
        "id": "s",
        "cron": "* * * * *",
        "promise_id": "{{.timestamp}}",
        "promise_timeout": 1000,
        "promise_param": EMPTY,
        "promise_tags": {},
        "created_at": 1000,
        "next_run_at": 60_000,
    }
    fields.update(kw)
    return Schedule(**fields)


def S(*rows: Any) -> State:
    return State(
        tuple(r for r in rows if isinstance(r, Promise)),
        tuple(r for r in rows if isinstance(r, Task)),
        tuple(r for r in rows if isinstance(r, Schedule)),
        tuple(r for r in rows if isinstance(r, Entry)),
    )


def rec(p: Promise) -> Promise:
    return p.without_ledgers()


NOW = 3000
TP = P(tags=TGT)  # a targeted promise ...
TPD = P(tags=TGT, state=RESOLVED)  # ... and settled

#: name → (now, violating state)
STATE_VIOLATORS: dict[str, tuple[int, State]] = {
    "well_formed_promise_created_at_lte_timeout_at": (
        NOW,
        S(P(created_at=20_000, state=RESOLVED, settled_at=20_000)),
    ),
    "well_formed_promise_pending_created_before_deadline": (
        NOW,
        S(P(created_at=10_000, timeout_at=10_000)),
    ),
    "well_formed_promise_settled_at_lte_timeout_at": (NOW, S(P(state=REJECTED, timeout_at=1500))),
    "well_formed_promise_created_at_lte_settled_at": (NOW, S(P(state=RESOLVED, created_at=2500))),
    "well_formed_promise_settled_at_iff_not_pending": (NOW, S(P(settled_at=2000))),
    "well_formed_promise_pending_has_no_value": (NOW, S(P(value=X))),
    "well_formed_promise_deadline_verdict_matches_timer_tag": (
        NOW,
        S(P(state=REJECTED, timeout_at=2000)),
    ),
    "well_formed_promise_deadline_settlement_has_no_value": (
        NOW,
        S(P(state=REJECTED_TIMEDOUT, timeout_at=2000, value=X)),
    ),
    "well_formed_promise_timer_not_targeted": (
        NOW,
        S(P(tags={"resonate:timer": "true", **TGT}), T()),
    ),
    "well_formed_promise_timedout_is_server_owned": (NOW, S(P(state=REJECTED_TIMEDOUT))),
    "well_formed_promise_callbacks_unique": (
        NOW,
        S(P(tags=EXT, callbacks=("t", "t")), P("t", tags=TGT), T("t")),
    ),
    "well_formed_promise_listeners_unique": (
        NOW,
        S(P(tags=EXT, listeners=("http://l", "http://l"))),
    ),
    "well_formed_promise_obligations_require_external": (NOW, S(P(listeners=("http://l",)))),
    "well_formed_promise_awaiter_is_not_self": (NOW, S(P(tags=TGT, callbacks=("p",)), T())),
    "well_formed_promise_created_at_lte_now": (500, S(P())),
    "well_formed_promise_settled_at_lte_now": (
        1500,
        S(P(state=RESOLVED, created_at=1000, settled_at=1600)),
    ),
    "well_formed_task_acquired_iff_has_pid": (NOW, S(TP, T(state=ACQUIRED, version=1, pid=None))),
    "well_formed_task_acquired_iff_has_ttl": (NOW, S(TP, T(state=ACQUIRED, version=1, ttl=None))),
    "well_formed_task_acquired_iff_has_expires_at": (
        NOW,
        S(TP, T(state=ACQUIRED, version=1, expires_at=None)),
    ),
    "well_formed_task_pending_iff_has_retry_at": (NOW, S(TP, T(retry_at=None))),
    "well_formed_task_fulfilled_is_cleared": (NOW, S(TPD, T(state=FULFILLED, resumes=("q",)))),
    "well_formed_task_suspended_is_cleared": (
        NOW,
        S(TP, T(state=SUSPENDED, retry_at=1), P("q", tags=EXT, callbacks=("p",))),
    ),
    "well_formed_task_halted_is_cleared": (NOW, S(TP, T(state=HALTED, pid="w"))),
    "well_formed_task_suspended_has_no_resumes": (
        NOW,
        S(TP, T(state=SUSPENDED, resumes=("q",)), P("q", tags=EXT, callbacks=("p",))),
    ),
    "well_formed_task_resumes_unique": (NOW, S(TP, T(resumes=("q", "q")))),
    "well_formed_task_acquired_version_positive": (NOW, S(TP, T(state=ACQUIRED, version=0))),
    "well_formed_schedule_promise_tags_not_timer_targeted": (
        NOW,
        S(C(promise_tags={"resonate:timer": "true", **TGT})),
    ),
    "well_formed_schedule_created_at_lte_next_run_at": (NOW, S(C(created_at=70_000))),
    "well_formed_schedule_created_at_lte_last_run_at": (
        NOW,
        S(C(created_at=2000, last_run_at=1000)),
    ),
    "well_formed_schedule_last_run_at_lt_next_run_at": (NOW, S(C(last_run_at=60_000))),
    "well_formed_store_promise_ids_unique": (NOW, S(P(), P())),
    "well_formed_store_task_ids_unique": (NOW, S(TP, T(), T())),
    "well_formed_store_schedule_ids_unique": (NOW, S(C(), C())),
    "well_formed_store_outbox_keys_unique": (
        NOW,
        S(TP, T(), Entry("poll://any@w", Execute("p", 0)), Entry("poll://any@v", Execute("p", 0))),
    ),
    "consistent_task_iff_targeted_promise": (NOW, S(TP)),
    "consistent_settled_promise_has_fulfilled_task": (NOW, S(TPD, T())),
    "consistent_callback_awaiter_is_targeted": (NOW, S(P(tags=EXT, callbacks=("q",)), P("q"))),
    "consistent_listener_addresses_deliverable": (NOW, S(P(tags=EXT, listeners=("ftp://l",)))),
    "consistent_outbox_execute_names_existing_task": (NOW, S(Entry("", Execute("ghost", 0)))),
    "consistent_outbox_never_ahead": (NOW, S(TP, T(), Entry("poll://any@w", Execute("p", 1)))),
    "consistent_outbox_execute_address_is_target_tag": (
        NOW,
        S(TP, T(), Entry("http://elsewhere", Execute("p", 0))),
    ),
    "consistent_outbox_unblock_names_settled_promise": (
        NOW,
        S(P(tags=EXT), Entry("http://l", Unblock(rec(P(tags=EXT))))),
    ),
    "consistent_outbox_unblock_address_deliverable": (
        NOW,
        S(P(tags=EXT, state=RESOLVED), Entry("ftp://l", Unblock(rec(P(tags=EXT, state=RESOLVED))))),
    ),
    "consistent_settled_task_promise_settled": (NOW, S(TP, T(state=FULFILLED))),
    "consistent_suspended_task_holds_rung": (NOW, S(TP, T(state=SUSPENDED))),
}

A = P(tags=EXT)  # an external pending promise
W = P("t", tags=TGT)  # an awaiter ...
WT = T("t", state=SUSPENDED)  # ... and its suspended task

#: name → (now, pre-state, post-state)
TRANS_VIOLATORS: dict[str, tuple[int, State, State]] = {
    "preserved_promise_birth_fields_immutable": (NOW, S(P()), S(P(param=X))),
    "preserved_settled_promise_record": (NOW, S(P(state=RESOLVED)), S(P(state=RESOLVED, value=X))),
    "monotone_promise_set_grows": (NOW, S(P()), S()),
    "monotone_task_set_grows": (NOW, S(TP, T()), S(TP)),
    "monotone_task_version_increases_only_on_acquisition": (NOW, S(TP, T()), S(TP, T(version=1))),
    "preserved_fulfilled_task": (
        NOW,
        S(TPD, T(state=FULFILLED)),
        S(TPD, T(state=FULFILLED, version=1)),
    ),
    "preserved_promise_state_frozen_once_settled": (
        NOW,
        S(P(state=RESOLVED)),
        S(P(state=REJECTED)),
    ),
    "preserved_promise_settlement_is_one_way": (NOW, S(P(state=RESOLVED)), S(P())),
    "consistent_promise_settled_at_moves_with_state": (
        NOW,
        S(P(state=RESOLVED)),
        S(P(state=RESOLVED, settled_at=2500)),
    ),
    "preserved_promise_value_until_settlement": (NOW, S(P()), S(P(value=X))),
    "preserved_promise_no_duplicate_ids": (NOW, S(P()), S(P(), P())),
    "monotone_promise_callbacks_grow_while_pending": (
        NOW,
        S(replace(A, callbacks=("t",)), W, T("t")),
        S(A, W, T("t")),
    ),
    "monotone_promise_callbacks_shrink_once_settled": (
        NOW,
        S(P(tags=EXT, state=RESOLVED), W, T("t")),
        S(P(tags=EXT, state=RESOLVED, callbacks=("t",)), W, T("t")),
    ),
    "monotone_promise_listeners_grow_while_pending": (
        NOW,
        S(replace(A, listeners=("http://l",))),
        S(A),
    ),
    "monotone_promise_listeners_shrink_once_settled": (
        NOW,
        S(P(tags=EXT, state=RESOLVED)),
        S(P(tags=EXT, state=RESOLVED, listeners=("http://l",))),
    ),
    "consistent_promise_state_edge_admissible": (NOW, S(P(state=RESOLVED)), S(P(state=REJECTED))),
    "consistent_task_state_edge_admissible": (NOW, S(TPD, T(state=FULFILLED)), S(TPD, T())),
    "preserved_task_acquisition_only_from_pending": (
        NOW,
        S(TP, T(state=HALTED)),
        S(TP, T(state=ACQUIRED, expires_at=NOW + 100)),
    ),
    "preserved_task_suspension_only_from_acquired": (NOW, S(TP, T()), S(TP, T(state=SUSPENDED))),
    "preserved_task_halted_only_reenters_via_pending": (
        NOW,
        S(TP, T(state=HALTED)),
        S(TP, T(state=SUSPENDED)),
    ),
    "consistent_settlement_fulfils_task": (NOW, S(TP, T()), S(TPD, T())),
    "consistent_task_fulfilment_needs_settlement": (NOW, S(TP, T()), S(TP, T(state=FULFILLED))),
    "consistent_obligation_discharge_requires_settled": (
        NOW,
        S(replace(A, listeners=("http://l",))),
        S(A),
    ),
    "consistent_callback_consumption_resumes_awaiter": (
        NOW,
        S(P(tags=EXT, state=RESOLVED, callbacks=("t",)), W, WT),
        S(P(tags=EXT, state=RESOLVED), W, WT),
    ),
    "consistent_listener_consumption_enqueues_unblock": (
        NOW,
        S(P(tags=EXT, state=RESOLVED, listeners=("http://l",))),
        S(P(tags=EXT, state=RESOLVED)),
    ),
    "consistent_wake_follows_callback_consumption": (
        NOW,
        S(W, WT),
        S(W, T("t", retry_at=NOW, resumes=("p",))),
    ),
    "consistent_suspension_registers_callback": (
        NOW,
        S(W, T("t", state=ACQUIRED, version=1)),
        S(W, WT),
    ),
    "consistent_task_birth_couples_promise_birth": (NOW, S(P()), S(P(), T())),
    "monotone_outbox_keys_never_disappear": (
        NOW,
        S(TP, T(), Entry("poll://any@w", Execute("p", 0))),
        S(TP, T()),
    ),
    "consistent_new_execute_matches_task_and_target": (
        NOW,
        S(TP, T(version=1)),
        S(TP, T(version=1), Entry("poll://any@w", Execute("p", 0))),
    ),
    "consistent_new_unblock_carries_stored_record": (
        NOW,
        S(P(tags=EXT, state=RESOLVED, listeners=("http://l",))),
        S(
            P(tags=EXT, state=RESOLVED),
            Entry("http://l", Unblock(rec(P(tags=EXT, state=REJECTED)))),
        ),
    ),
    "consistent_new_unblock_discharges_its_listener": (
        NOW,
        S(P(tags=EXT, state=RESOLVED)),
        S(
            P(tags=EXT, state=RESOLVED),
            Entry("http://l", Unblock(rec(P(tags=EXT, state=RESOLVED)))),
        ),
    ),
    "preserved_schedule_birth_fields_immutable": (NOW, S(C()), S(C(cron="*/10 * * * * *"))),
    "consistent_task_birth_state": (NOW, S(TP), S(TP, T(retry_at=None))),
    "consistent_task_lease_released_atomically": (
        NOW,
        S(TP, T(state=ACQUIRED, version=1)),
        S(TP, T(version=1, retry_at=NOW, pid="w")),
    ),
    "preserved_task_lease_holder_stable": (
        NOW,
        S(TP, T(state=ACQUIRED, version=1)),
        S(TP, T(state=ACQUIRED, version=1, pid="v")),
    ),
    "consistent_task_lease_fields_move_together": (NOW, S(TP, T()), S(TP, T(ttl=100))),
    "monotone_task_resumes_grow_or_clear": (
        NOW,
        S(TP, T(resumes=("q",))),
        S(TP, T(resumes=("r",))),
    ),
    "consistent_task_resumes_cleared_only_on_dispatch_or_park": (
        NOW,
        S(TP, T(resumes=("q",))),
        S(TP, T()),
    ),
    "preserved_no_dead_dispatch": (
        NOW,
        S(P(tags=TGT, timeout_at=2000), T(state=HALTED)),
        S(P(tags=TGT, timeout_at=2000), T(retry_at=NOW)),
    ),
    "preserved_execute_only_for_live_task": (
        NOW,
        S(P(tags=TGT, timeout_at=2000), T()),
        S(P(tags=TGT, timeout_at=2000), T(), Entry("poll://any@w", Execute("p", 0))),
    ),
    "consistent_promise_settlement_stamp": (NOW, S(P()), S(P(state=RESOLVED, settled_at=NOW - 1))),
    "preserved_timedout_is_server_owned": (
        NOW,
        S(P()),
        S(P(state=REJECTED_TIMEDOUT, settled_at=NOW)),
    ),
    "consistent_new_promise_born_clean": (NOW, S(), S(P(tags=EXT, listeners=("http://l",)))),
    "consistent_task_acquisition_is_atomic": (
        NOW,
        S(TP, T()),
        S(TP, T(state=ACQUIRED, version=1, expires_at=NOW + 101)),
    ),
    "consistent_task_lease_deadline_is_now_plus_ttl": (
        NOW,
        S(TP, T(state=ACQUIRED, version=1)),
        S(TP, T(state=ACQUIRED, version=1, expires_at=9999)),
    ),
    "consistent_task_pending_entry_arms_retry": (
        NOW,
        S(TP, T(state=HALTED)),
        S(TP, T(retry_at=NOW + 1)),
    ),
    "consistent_task_retry_rearm_only_when_due": (
        NOW,
        S(TP, T(retry_at=9000)),
        S(TP, T(retry_at=12_000)),
    ),
    "monotone_task_retry_rearm_advances": (NOW, S(TP, T(retry_at=500)), S(TP, T(retry_at=800))),
    "consistent_task_wake_records_resume": (
        NOW,
        S(W, WT, P(tags=EXT, state=RESOLVED, callbacks=("t",))),
        S(W, T("t", retry_at=NOW), P(tags=EXT, state=RESOLVED)),
    ),
}

INTERNAL_VIOLATORS: dict[str, tuple[int, State, State]] = {
    "consistent_task_state_edge_internal_admissible": (
        NOW,
        S(TP, T()),
        S(TP, T(state=ACQUIRED, version=1, expires_at=NOW + 100)),
    ),
    "consistent_promise_state_edge_internal_admissible": (
        NOW,
        S(P()),
        S(P(state=RESOLVED, settled_at=NOW)),
    ),
}

GAP_VIOLATORS: dict[str, tuple[int, State]] = {
    "well_formed_task_ttl_positive": (
        NOW,
        S(TP, T(state=ACQUIRED, version=1, ttl=0, expires_at=NOW)),
    ),
    "well_formed_promise_target_is_nonempty": (NOW, S(P(tags={"resonate:target": ""}), T())),
    "well_formed_promise_delay_before_deadline": (
        NOW,
        S(P(tags={**TGT, "resonate:delay": "10000"}), T(retry_at=10_000)),
    ),
}


def test_the_catalogue_has_95_entries_with_the_specifications_names() -> None:
    assert len(STATE_PROPERTIES) == 45 and len(TRANS_PROPERTIES) == 50
    assert set(STATE_VIOLATORS) == set(STATE_PROPERTIES)
    assert set(TRANS_VIOLATORS) == set(TRANS_PROPERTIES)
    assert set(INTERNAL_VIOLATORS) == set(INTERNAL_PROPERTIES)
    assert set(GAP_VIOLATORS) == set(KNOWN_GAPS)
    for name in [*STATE_PROPERTIES, *TRANS_PROPERTIES]:
        assert name.startswith(("well_formed_", "consistent_", "preserved_", "monotone_")), name


@pytest.mark.parametrize("name", sorted(STATE_VIOLATORS))
def test_every_state_property_rejects_a_violator(name: str) -> None:
    now, state = STATE_VIOLATORS[name]
    assert name in state_failures(now, state)


@pytest.mark.parametrize("name", sorted(TRANS_VIOLATORS))
def test_every_transition_property_rejects_a_violator(name: str) -> None:
    now, a, b = TRANS_VIOLATORS[name]
    assert name in trans_failures(now, a, b)


@pytest.mark.parametrize("name", sorted(INTERNAL_VIOLATORS))
def test_every_provenance_check_rejects_a_violator(name: str) -> None:
    now, a, b = INTERNAL_VIOLATORS[name]
    assert not INTERNAL_PROPERTIES[name](now, a, b)


@pytest.mark.parametrize("name", sorted(GAP_VIOLATORS))
def test_every_known_gap_rejects_a_violator(name: str) -> None:
    now, state = GAP_VIOLATORS[name]
    assert not KNOWN_GAPS[name](now, state)
    assert state_failures(now, state) == []  # the gap shapes are legal catalogue states


# ---------------------------------------------------------------------- a baseline run

BASELINE: list[tuple[str, Any]] = [
    ("promise.create", {"id": "x", "timeoutAt": 50_000, "tags": EXT}),
    ("promise.create", {"id": "y", "timeoutAt": 5000, "tags": {"resonate:timer": "true"}}),
    ("promise.register_listener", {"awaited": "x", "address": "http://l"}),
    (
        "task.create",
        {
            "pid": "w",
            "ttl": 2000,
            "action": {
                "kind": "promise.create",
                "data": {"id": "t", "timeoutAt": 60_000, "tags": TGT},
            },
        },
    ),
    (
        "task.suspend",
        {
            "id": "t",
            "version": 1,
            "actions": [
                {"kind": "promise.register_callback", "data": {"awaited": "x", "awaiter": "t"}},
                {"kind": "promise.register_callback", "data": {"awaited": "y", "awaiter": "t"}},
            ],
        },
    ),
    ("tick", 5000),  # y resolves by its deadline: t wakes, is dispatched
    ("task.acquire", {"id": "t", "version": 1, "pid": "w", "ttl": 1000}),
    ("task.heartbeat", {"pid": "w", "tasks": [{"id": "t", "version": 2}]}),
    ("tick", 7000),  # the lease runs out
    ("task.halt", {"id": "t"}),
    ("task.continue", {"id": "t"}),
    ("promise.settle", {"id": "x", "state": "resolved", "value": {"data": "v"}}),
    (
        "task.create",
        {
            "pid": "v",
            "ttl": 1000,
            "action": {"kind": "promise.create", "data": {"id": "t", "timeoutAt": 1, "tags": TGT}},
        },
    ),
    (
        "task.fulfill",
        {
            "id": "t",
            "version": 3,
            "action": {"kind": "promise.settle", "data": {"state": "rejected"}},
        },
    ),
]


def run_model(script: list[tuple[str, Any]]) -> list[tuple[int, m.Transition, State]]:
    """Every single step of the model along ``script``, as (now, step, pre-state)."""
    state, now, out = State(), 1000, []
    for kind, arg in script:
        if kind == "tick":
            now = arg
            chain = m.tick(state, now)
        else:
            _, chain = m.after_request(state, kind, arg, now)
        for tr in chain:
            out.append((now, tr, state))
            state = tr.state
    return out


def test_the_baseline_run_visits_every_task_state_and_keeps_all_95() -> None:
    steps = run_model(BASELINE)
    seen = {t.state for _, tr, _ in steps for t in tr.state.tasks}
    assert seen == {PENDING, ACQUIRED, SUSPENDED, HALTED, FULFILLED}
    fired = {tr.label[0] for _, tr, _ in steps}
    assert {"r1", "r3", "r4", "r5", "r6"} <= fired
    for now, tr, before in steps:
        assert state_failures(now, tr.state) == [], tr.label
        assert trans_failures(now, before, tr.state) == [], tr.label


# ---------------------------------------------------------------------- the map onto troth


def test_from_snap_takes_the_latest_outbox_row_per_key() -> None:
    """troth keeps delivered rows and may hold a newer message beside an older claimed
    one: per key the model's outbox is the latest row."""
    record = {
        "id": "p",
        "state": "pending",
        "param": {},
        "value": {},
        "tags": TGT,
        "timeoutAt": 10_000,
        "createdAt": 1000,
    }
    snap = {
        "promises": [{**record, "callbacks": [], "listeners": []}],
        "tasks": [{"id": "p", "state": "pending", "version": 1, "retryAt": 6000, "resumes": ["q"]}],
        "schedules": [],
        "outbox": [
            {
                "id": 7,
                "key": "p",
                "address": "poll://any@w",
                "state": "dispatching",
                "message": {"kind": "execute", "taskId": "p", "version": 0},
            },
            {
                "id": 9,
                "key": "p",
                "address": "poll://any@w",
                "state": "pending",
                "message": {"kind": "execute", "taskId": "p", "version": 1},
            },
        ],
    }
    state = from_snap(snap)
    assert state.outbox == (Entry("poll://any@w", Execute("p", 1)),)
    assert state.tasks == (Task("p", PENDING, 1, retry_at=6000, resumes=("q",)),)
    assert state.promises[0].record() == record


def test_troth_store_maps_onto_the_model_and_keeps_the_catalogue(server: RunningServer) -> None:
    """The baseline run over HTTP: troth's store equals the model's after every request
    and tick, and the catalogue holds of it."""
    now, state = 1000, State()
    for kind, arg in BASELINE:
        before = from_snap(server.snap())
        if kind == "tick":
            now = arg
            chain = m.tick(state, now)
            server.tick(now)
        else:
            response, chain = m.after_request(state, kind, arg, now)
            status, _ = server.call(kind, arg, now)
            assert status == response.status, (kind, arg)
        after = from_snap(server.snap())
        state = chain[-1].state if chain else state
        key: dict[str, Callable[[Any], Any]] = {
            "promises": lambda p: p.id,
            "tasks": lambda t: t.id,
            "outbox": lambda e: e.key,
        }
        for table, k in key.items():
            assert sorted(getattr(after, table), key=k) == sorted(getattr(state, table), key=k)
        assert state_failures(now, after) == []
        assert "monotone_promise_set_grows" not in trans_failures(now, before, after)


# ---------------------------------------------------------------------- the known gaps


def task_create(ttl: int, tags: dict[str, str], timeout_at: int = 60_000) -> dict[str, Any]:
    action = {"kind": "promise.create", "data": {"id": "g", "timeoutAt": timeout_at, "tags": tags}}
    return {"pid": "w", "ttl": ttl, "action": action}


def test_gap_ttl_zero_is_accepted_and_expires_at_grant(server: RunningServer) -> None:
    """``well_formed_task_ttl_positive``: troth accepts ``ttl = 0`` (docs/protocol.md).
    The grant answers ``acquired`` with ttl 0; the lease is already over, so r5 re-pends
    the task in the same transaction and r6 dispatches the next version — the gap
    shape is answered but never stored."""
    out = server.ok("task.create", task_create(0, TGT), 1000)
    assert out["task"] == {
        "id": "g",
        "state": "acquired",
        "version": 1,
        "resumes": 0,
        "ttl": 0,
        "pid": "w",
    }
    state = from_snap(server.snap())
    assert state.task("g") == Task("g", PENDING, 1, retry_at=6000)
    assert state.outbox == (Entry("poll://any@w", Execute("g", 1)),)
    assert state_failures(1000, state) == []
    assert (
        server.call("task.acquire", {"id": "g", "version": 1, "pid": "v", "ttl": 0}, 1000)[0] == 200
    )


def test_gap_empty_target_is_accepted_and_dispatched_to_nowhere(server: RunningServer) -> None:
    """``well_formed_promise_target_is_nonempty``: troth accepts ``resonate:target = ""``
    and writes the execute to address ``""`` (its delivery then fails permanently)."""
    server.ok(
        "promise.create", {"id": "g", "timeoutAt": 60_000, "tags": {"resonate:target": ""}}, 1000
    )
    state = from_snap(server.snap())
    assert not KNOWN_GAPS["well_formed_promise_target_is_nonempty"](1000, state)
    assert state_failures(1000, state) == []
    rows = [r for r in server.snap()["outbox"] if r["key"] == "g"]
    assert [r["address"] for r in rows] == [""]


def test_gap_delay_past_the_deadline_is_accepted_and_never_dispatched(
    server: RunningServer,
) -> None:
    """``well_formed_promise_delay_before_deadline``: a delay at or after the deadline is
    accepted; the task is never dispatched and the promise times out."""
    tags = {**TGT, "resonate:delay": "70000"}
    server.ok("promise.create", {"id": "g", "timeoutAt": 60_000, "tags": tags}, 1000)
    state = from_snap(server.snap())
    assert not KNOWN_GAPS["well_formed_promise_delay_before_deadline"](1000, state)
    assert state_failures(1000, state) == []
    server.tick(60_000)
    assert server.snap()["outbox"] == []
    assert server.ok("task.get", {"id": "g"}, 60_000)["task"]["state"] == "fulfilled"


def test_config_retry_timeout_must_be_positive() -> None:
    """``well_formed_config_retry_positive`` is enforced at startup, not accepted."""
    assert well_formed_config_retry_positive()
    with pytest.raises(ConfigError):
        Settings(retry_timeout=0)
