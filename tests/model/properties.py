"""The conformance catalogue of SPEC.md §6: 45 state and 50 transition properties.

Each property is a plain function with the catalogue's portable name, over the model's
:class:`~model.machine.State` (``f(now, s)``) or over one step's pair of states
(``f(now, a, b)``).  The quantifier is inside each function, as in the specification,
so the predicate read here is the predicate that runs.  :mod:`model.mapping` turns a
troth ``debug.snap`` into the same shape, so these run against troth's real stores.

Where SPEC.md's one-line claim leaves a detail open, the statement follows the Lean
catalogue (``spec/02-abstract/properties.lean``), read at the granularity of this
revision: separate promise and task rows, no combinators.

Outside the catalogue (§6.3) and kept apart: the three known gaps plus the
configuration condition (:data:`KNOWN_GAPS`; troth accepts the gaps, as the
specification does, docs/protocol.md), and the two provenance checks for internal
steps (:data:`INTERNAL_PROPERTIES`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from model.machine import (
    ACQUIRED,
    DELAY,
    FULFILLED,
    HALTED,
    PENDING,
    REJECTED_TIMEDOUT,
    RESOLVED,
    RETRY_TIMEOUT,
    SUSPENDED,
    TARGET,
    Execute,
    State,
    Unblock,
    address_valid,
    external,
    is_timer,
    parse_nat,
    project,
    targeted,
    timer_targeted,
)

StateProperty = Callable[[int, State], bool]
TransProperty = Callable[[int, State, State], bool]


def unique(xs: Iterable[str]) -> bool:
    items = list(xs)
    return len(set(items)) == len(items)


def subset(xs: Iterable[str], ys: Iterable[str]) -> bool:
    ys = list(ys)
    return all(x in ys for x in xs)


# ========================================================================= state (1–45)


def well_formed_promise_created_at_lte_timeout_at(now: int, s: State) -> bool:
    return all(p.created_at <= p.timeout_at for p in s.promises)


def well_formed_promise_pending_created_before_deadline(now: int, s: State) -> bool:
    return all(p.state != PENDING or p.created_at < p.timeout_at for p in s.promises)


def well_formed_promise_settled_at_lte_timeout_at(now: int, s: State) -> bool:
    return all(p.settled_at is None or p.settled_at <= p.timeout_at for p in s.promises)


def well_formed_promise_created_at_lte_settled_at(now: int, s: State) -> bool:
    return all(p.settled_at is None or p.created_at <= p.settled_at for p in s.promises)


def well_formed_promise_settled_at_iff_not_pending(now: int, s: State) -> bool:
    return all((p.state != PENDING) == (p.settled_at is not None) for p in s.promises)


def well_formed_promise_pending_has_no_value(now: int, s: State) -> bool:
    return all(p.state != PENDING or p.value.is_empty() for p in s.promises)


def well_formed_promise_deadline_verdict_matches_timer_tag(now: int, s: State) -> bool:
    return all(
        p.settled_at != p.timeout_at
        or p.state == (RESOLVED if is_timer(p.tags) else REJECTED_TIMEDOUT)
        for p in s.promises
    )


def well_formed_promise_deadline_settlement_has_no_value(now: int, s: State) -> bool:
    return all(p.settled_at != p.timeout_at or p.value.is_empty() for p in s.promises)


def well_formed_promise_timer_not_targeted(now: int, s: State) -> bool:
    return all(not timer_targeted(p.tags) for p in s.promises)


def well_formed_promise_timedout_is_server_owned(now: int, s: State) -> bool:
    return all(p.state != REJECTED_TIMEDOUT or p.settled_at == p.timeout_at for p in s.promises)


def well_formed_promise_callbacks_unique(now: int, s: State) -> bool:
    return all(unique(p.callbacks) for p in s.promises)


def well_formed_promise_listeners_unique(now: int, s: State) -> bool:
    return all(unique(p.listeners) for p in s.promises)


def well_formed_promise_obligations_require_external(now: int, s: State) -> bool:
    return all((not p.callbacks and not p.listeners) or external(p.tags) for p in s.promises)


def well_formed_promise_awaiter_is_not_self(now: int, s: State) -> bool:
    return all(p.id not in p.callbacks for p in s.promises)


def well_formed_promise_created_at_lte_now(now: int, s: State) -> bool:
    return all(p.created_at <= now for p in s.promises)


def well_formed_promise_settled_at_lte_now(now: int, s: State) -> bool:
    return all(p.settled_at is None or p.settled_at <= now for p in s.promises)


def well_formed_task_acquired_iff_has_pid(now: int, s: State) -> bool:
    return all((t.state == ACQUIRED) == (t.pid is not None) for t in s.tasks)


def well_formed_task_acquired_iff_has_ttl(now: int, s: State) -> bool:
    return all((t.state == ACQUIRED) == (t.ttl is not None) for t in s.tasks)


def well_formed_task_acquired_iff_has_expires_at(now: int, s: State) -> bool:
    return all((t.state == ACQUIRED) == (t.expires_at is not None) for t in s.tasks)


def well_formed_task_pending_iff_has_retry_at(now: int, s: State) -> bool:
    return all((t.state == PENDING) == (t.retry_at is not None) for t in s.tasks)


def _cleared(t: object) -> bool:
    return all(getattr(t, f) is None for f in ("pid", "ttl", "expires_at", "retry_at"))


def well_formed_task_fulfilled_is_cleared(now: int, s: State) -> bool:
    return all(t.state != FULFILLED or (_cleared(t) and not t.resumes) for t in s.tasks)


def well_formed_task_suspended_is_cleared(now: int, s: State) -> bool:
    return all(t.state != SUSPENDED or _cleared(t) for t in s.tasks)


def well_formed_task_halted_is_cleared(now: int, s: State) -> bool:
    return all(t.state != HALTED or _cleared(t) for t in s.tasks)


def well_formed_task_suspended_has_no_resumes(now: int, s: State) -> bool:
    return all(t.state != SUSPENDED or not t.resumes for t in s.tasks)


def well_formed_task_resumes_unique(now: int, s: State) -> bool:
    return all(unique(t.resumes) for t in s.tasks)


def well_formed_task_acquired_version_positive(now: int, s: State) -> bool:
    return all(t.state != ACQUIRED or t.version >= 1 for t in s.tasks)


def well_formed_schedule_promise_tags_not_timer_targeted(now: int, s: State) -> bool:
    return all(not timer_targeted(c.promise_tags) for c in s.schedules)


def well_formed_schedule_created_at_lte_next_run_at(now: int, s: State) -> bool:
    return all(c.created_at <= c.next_run_at for c in s.schedules)


def well_formed_schedule_created_at_lte_last_run_at(now: int, s: State) -> bool:
    return all(c.last_run_at is None or c.created_at <= c.last_run_at for c in s.schedules)


def well_formed_schedule_last_run_at_lt_next_run_at(now: int, s: State) -> bool:
    return all(c.last_run_at is None or c.last_run_at < c.next_run_at for c in s.schedules)


def well_formed_store_promise_ids_unique(now: int, s: State) -> bool:
    return unique(p.id for p in s.promises)


def well_formed_store_task_ids_unique(now: int, s: State) -> bool:
    return unique(t.id for t in s.tasks)


def well_formed_store_schedule_ids_unique(now: int, s: State) -> bool:
    return unique(c.id for c in s.schedules)


def well_formed_store_outbox_keys_unique(now: int, s: State) -> bool:
    return unique(e.key for e in s.outbox)


def consistent_task_iff_targeted_promise(now: int, s: State) -> bool:
    every_task_owned = all((p := s.promise(t.id)) is not None and targeted(p.tags) for t in s.tasks)
    every_target_tasked = all(s.task(p.id) is not None for p in s.promises if targeted(p.tags))
    return every_task_owned and every_target_tasked


def consistent_settled_promise_has_fulfilled_task(now: int, s: State) -> bool:
    return all(
        p.state == PENDING or (t := s.task(p.id)) is None or t.state == FULFILLED
        for p in s.promises
    )


def consistent_callback_awaiter_is_targeted(now: int, s: State) -> bool:
    return all(
        (q := s.promise(x)) is not None and targeted(q.tags)
        for p in s.promises
        for x in p.callbacks
    )


def consistent_listener_addresses_deliverable(now: int, s: State) -> bool:
    return all(address_valid(a) for p in s.promises for a in p.listeners)


def consistent_outbox_execute_names_existing_task(now: int, s: State) -> bool:
    return all(
        s.task(e.message.task_id) is not None for e in s.outbox if isinstance(e.message, Execute)
    )


def consistent_outbox_never_ahead(now: int, s: State) -> bool:
    return all(
        (t := s.task(e.message.task_id)) is None or e.message.version <= t.version
        for e in s.outbox
        if isinstance(e.message, Execute)
    )


def consistent_outbox_execute_address_is_target_tag(now: int, s: State) -> bool:
    return all(
        (p := s.promise(e.message.task_id)) is None or e.address == p.tags.get(TARGET, "")
        for e in s.outbox
        if isinstance(e.message, Execute)
    )


def consistent_outbox_unblock_names_settled_promise(now: int, s: State) -> bool:
    return all(
        e.message.promise.state != PENDING
        and (p := s.promise(e.message.promise.id)) is not None
        and p.state != PENDING
        for e in s.outbox
        if isinstance(e.message, Unblock)
    )


def consistent_outbox_unblock_address_deliverable(now: int, s: State) -> bool:
    return all(address_valid(e.address) for e in s.outbox if isinstance(e.message, Unblock))


def consistent_settled_task_promise_settled(now: int, s: State) -> bool:
    return all(
        t.state != FULFILLED or (p := s.promise(t.id)) is None or p.state != PENDING
        for t in s.tasks
    )


def consistent_suspended_task_holds_rung(now: int, s: State) -> bool:
    return all(
        t.state != SUSPENDED
        or (p := s.promise(t.id)) is None
        or project(p, now).state != PENDING
        or any(t.id in q.callbacks for q in s.promises)
        for t in s.tasks
    )


# ==================================================================== transitions (46–95)


def preserved_promise_birth_fields_immutable(now: int, a: State, b: State) -> bool:
    return all(
        (q := b.promise(p.id)) is None
        or (
            q.param == p.param
            and q.tags == p.tags
            and q.timeout_at == p.timeout_at
            and q.created_at == p.created_at
        )
        for p in a.promises
    )


def preserved_settled_promise_record(now: int, a: State, b: State) -> bool:
    return all(
        p.state == PENDING
        or (
            (q := b.promise(p.id)) is not None
            and q.state == p.state
            and q.settled_at == p.settled_at
            and q.value == p.value
        )
        for p in a.promises
    )


def monotone_promise_set_grows(now: int, a: State, b: State) -> bool:
    return all(b.promise(p.id) is not None for p in a.promises)


def monotone_task_set_grows(now: int, a: State, b: State) -> bool:
    return all(b.task(t.id) is not None for t in a.tasks)


def monotone_task_version_increases_only_on_acquisition(now: int, a: State, b: State) -> bool:
    for t in a.tasks:
        u = b.task(t.id)
        if u is None:
            continue
        if t.state == PENDING and u.state == ACQUIRED:
            if u.version != t.version + 1:
                return False
        elif u.version != t.version:
            return False
    return True


def preserved_fulfilled_task(now: int, a: State, b: State) -> bool:
    return all(
        t.state != FULFILLED
        or (
            (u := b.task(t.id)) is not None
            and u.state == FULFILLED
            and u.version == t.version
            and not u.resumes
            and _cleared(u)
        )
        for t in a.tasks
    )


def preserved_promise_state_frozen_once_settled(now: int, a: State, b: State) -> bool:
    return all(
        p.state == PENDING or ((q := b.promise(p.id)) is not None and q.state == p.state)
        for p in a.promises
    )


def preserved_promise_settlement_is_one_way(now: int, a: State, b: State) -> bool:
    return all(
        q.state != PENDING or (p := a.promise(q.id)) is None or p.state == PENDING
        for q in b.promises
    )


def consistent_promise_settled_at_moves_with_state(now: int, a: State, b: State) -> bool:
    return all(
        (q := b.promise(p.id)) is not None
        and (q.settled_at != p.settled_at) == (q.state != p.state)
        for p in a.promises
    )


def preserved_promise_value_until_settlement(now: int, a: State, b: State) -> bool:
    return all(
        (q := b.promise(p.id)) is not None and (q.state != PENDING or q.value == p.value)
        for p in a.promises
    )


def preserved_promise_no_duplicate_ids(now: int, a: State, b: State) -> bool:
    return unique(q.id for q in b.promises)


def monotone_promise_callbacks_grow_while_pending(now: int, a: State, b: State) -> bool:
    return all(
        q.state != PENDING
        or (not q.callbacks if (p := a.promise(q.id)) is None else subset(p.callbacks, q.callbacks))
        for q in b.promises
    )


def monotone_promise_callbacks_shrink_once_settled(now: int, a: State, b: State) -> bool:
    return all(
        q.state == PENDING
        or (not q.callbacks if (p := a.promise(q.id)) is None else subset(q.callbacks, p.callbacks))
        for q in b.promises
    )


def monotone_promise_listeners_grow_while_pending(now: int, a: State, b: State) -> bool:
    return all(
        q.state != PENDING
        or (not q.listeners if (p := a.promise(q.id)) is None else subset(p.listeners, q.listeners))
        for q in b.promises
    )


def monotone_promise_listeners_shrink_once_settled(now: int, a: State, b: State) -> bool:
    return all(
        q.state == PENDING
        or (not q.listeners if (p := a.promise(q.id)) is None else subset(q.listeners, p.listeners))
        for q in b.promises
    )


PROMISE_EDGES = {(PENDING, x) for x in (PENDING, RESOLVED, "rejected", "rejected_canceled")} | {
    (PENDING, REJECTED_TIMEDOUT),
    (RESOLVED, RESOLVED),
    ("rejected", "rejected"),
    ("rejected_canceled", "rejected_canceled"),
    (REJECTED_TIMEDOUT, REJECTED_TIMEDOUT),
}

TASK_EDGES = {
    (PENDING, PENDING),
    (PENDING, ACQUIRED),
    (PENDING, HALTED),
    (PENDING, FULFILLED),
    (ACQUIRED, PENDING),
    (ACQUIRED, ACQUIRED),
    (ACQUIRED, SUSPENDED),
    (ACQUIRED, HALTED),
    (ACQUIRED, FULFILLED),
    (SUSPENDED, PENDING),
    (SUSPENDED, SUSPENDED),
    (SUSPENDED, HALTED),
    (SUSPENDED, FULFILLED),
    (HALTED, PENDING),
    (HALTED, HALTED),
    (HALTED, FULFILLED),
    (FULFILLED, FULFILLED),
}


def consistent_promise_state_edge_admissible(now: int, a: State, b: State) -> bool:
    return all(
        (q := b.promise(p.id)) is None or (p.state, q.state) in PROMISE_EDGES for p in a.promises
    )


def consistent_task_state_edge_admissible(now: int, a: State, b: State) -> bool:
    return all((u := b.task(t.id)) is None or (t.state, u.state) in TASK_EDGES for t in a.tasks)


def preserved_task_acquisition_only_from_pending(now: int, a: State, b: State) -> bool:
    return all(
        u.state != ACQUIRED or (t := a.task(u.id)) is None or t.state in (PENDING, ACQUIRED)
        for u in b.tasks
    )


def preserved_task_suspension_only_from_acquired(now: int, a: State, b: State) -> bool:
    return all(
        u.state != SUSPENDED
        or ((t := a.task(u.id)) is not None and t.state in (ACQUIRED, SUSPENDED))
        for u in b.tasks
    )


def preserved_task_halted_only_reenters_via_pending(now: int, a: State, b: State) -> bool:
    return all(
        t.state != HALTED
        or ((u := b.task(t.id)) is not None and u.state in (HALTED, PENDING, FULFILLED))
        for t in a.tasks
    )


def consistent_settlement_fulfils_task(now: int, a: State, b: State) -> bool:
    return all(
        p.state != PENDING
        or (q := b.promise(p.id)) is None
        or (u := b.task(p.id)) is None
        or q.state == PENDING
        or u.state == FULFILLED
        for p in a.promises
    )


def consistent_task_fulfilment_needs_settlement(now: int, a: State, b: State) -> bool:
    for u in b.tasks:
        t = a.task(u.id)
        if u.state != FULFILLED or t is None or t.state == FULFILLED:
            continue
        p, q = a.promise(u.id), b.promise(u.id)
        if p is None or q is None or not (p.state == PENDING and q.state != PENDING):
            return False
    return True


def consistent_obligation_discharge_requires_settled(now: int, a: State, b: State) -> bool:
    return all(
        (q := b.promise(p.id)) is None
        or (subset(p.callbacks, q.callbacks) and subset(p.listeners, q.listeners))
        or q.state != PENDING
        for p in a.promises
    )


def consistent_callback_consumption_resumes_awaiter(now: int, a: State, b: State) -> bool:
    for p in a.promises:
        q = b.promise(p.id)
        for x in p.callbacks:
            if q is None or x in q.callbacks:
                continue
            u = b.task(x)
            if u is not None and u.state != FULFILLED and p.id not in u.resumes:
                return False
    return True


def consistent_listener_consumption_enqueues_unblock(now: int, a: State, b: State) -> bool:
    for p in a.promises:
        q = b.promise(p.id)
        for addr in p.listeners:
            if q is None or addr in q.listeners:
                continue
            sent = [
                e
                for e in b.outbox
                if e.address == addr
                and isinstance(e.message, Unblock)
                and e.message.promise.id == p.id
                and e.message.promise.state != PENDING
            ]
            if len(sent) != 1:
                return False
    return True


def consistent_wake_follows_callback_consumption(now: int, a: State, b: State) -> bool:
    for u in b.tasks:
        t = a.task(u.id)
        if t is None or not (t.state == SUSPENDED and u.state == PENDING):
            continue
        if not any(
            u.id in p.callbacks
            and (q := b.promise(p.id)) is not None
            and u.id not in q.callbacks
            and p.id in u.resumes
            for p in a.promises
        ):
            return False
    return True


def consistent_suspension_registers_callback(now: int, a: State, b: State) -> bool:
    for u in b.tasks:
        if u.state != SUSPENDED:
            continue
        t = a.task(u.id)
        if t is not None and t.state == SUSPENDED:
            continue
        if not any(
            u.id in q.callbacks
            and ((p := a.promise(q.id)) is None or u.id not in p.callbacks)
            and q.state == PENDING
            for q in b.promises
        ):
            return False
    return True


def consistent_task_birth_couples_promise_birth(now: int, a: State, b: State) -> bool:
    for u in b.tasks:
        if a.task(u.id) is not None:
            continue
        q = b.promise(u.id)
        if a.promise(u.id) is not None or q is None or not targeted(q.tags):
            return False
        if (u.state == FULFILLED) != (q.state != PENDING):
            return False
        shapes = (
            (u.state == PENDING and u.version == 0)
            or (u.state == ACQUIRED and u.version >= 1)
            or (u.state == FULFILLED and u.version == 0)
        )
        if not shapes:
            return False
    return all(
        a.promise(q.id) is not None or not targeted(q.tags) or b.task(q.id) is not None
        for q in b.promises
    )


def monotone_outbox_keys_never_disappear(now: int, a: State, b: State) -> bool:
    keys = {f.key for f in b.outbox}
    return all(e.key in keys for e in a.outbox)


def _had_execute(a: State, task_id: str, version: int, address: str) -> bool:
    return any(
        isinstance(e.message, Execute)
        and e.message.task_id == task_id
        and e.message.version == version
        and e.address == address
        for e in a.outbox
    )


def _had_unblock(a: State, promise_id: str, address: str) -> bool:
    return any(
        isinstance(e.message, Unblock)
        and e.message.promise.id == promise_id
        and e.address == address
        for e in a.outbox
    )


def consistent_new_execute_matches_task_and_target(now: int, a: State, b: State) -> bool:
    for f in b.outbox:
        m = f.message
        if not isinstance(m, Execute) or _had_execute(a, m.task_id, m.version, f.address):
            continue
        t, p = b.task(m.task_id), b.promise(m.task_id)
        if t is None or t.version != m.version or p is None:
            return False
        if f.address != p.tags.get(TARGET, ""):
            return False
    return True


def consistent_new_unblock_carries_stored_record(now: int, a: State, b: State) -> bool:
    for f in b.outbox:
        m = f.message
        if not isinstance(m, Unblock) or _had_unblock(a, m.promise.id, f.address):
            continue
        r, p = m.promise, b.promise(m.promise.id)
        if r.state == PENDING or p is None:
            return False
        if (p.state, p.settled_at, p.value, p.timeout_at, p.created_at) != (
            r.state,
            r.settled_at,
            r.value,
            r.timeout_at,
            r.created_at,
        ):
            return False
    return True


def consistent_new_unblock_discharges_its_listener(now: int, a: State, b: State) -> bool:
    for f in b.outbox:
        m = f.message
        if not isinstance(m, Unblock) or _had_unblock(a, m.promise.id, f.address):
            continue
        p, q = a.promise(m.promise.id), b.promise(m.promise.id)
        if p is None or f.address not in p.listeners:
            return False
        if q is not None and f.address in q.listeners:
            return False
    return True


def preserved_schedule_birth_fields_immutable(now: int, a: State, b: State) -> bool:
    return all(
        (d := b.schedule(c.id)) is None
        or (
            d.cron == c.cron
            and d.promise_id == c.promise_id
            and d.promise_timeout == c.promise_timeout
            and d.promise_param == c.promise_param
            and d.promise_tags == c.promise_tags
            and d.created_at == c.created_at
        )
        for c in a.schedules
    )


def consistent_task_birth_state(now: int, a: State, b: State) -> bool:
    for u in b.tasks:
        if a.task(u.id) is not None:
            continue
        no_lease = u.pid is None and u.ttl is None and u.expires_at is None
        ok = (
            (u.state == PENDING and u.retry_at is not None and no_lease and not u.resumes)
            or (u.state == FULFILLED and u.retry_at is None and no_lease and not u.resumes)
            or (
                u.state == ACQUIRED
                and u.version >= 1
                and u.retry_at is None
                and u.pid is not None
                and u.ttl is not None
                and u.expires_at is not None
                and not u.resumes
            )
        )
        if not ok:
            return False
    return True


def consistent_task_lease_released_atomically(now: int, a: State, b: State) -> bool:
    return all(
        (u := b.task(t.id)) is None
        or not (t.state == ACQUIRED and u.state != ACQUIRED)
        or (u.pid is None and u.ttl is None and u.expires_at is None and u.version == t.version)
        for t in a.tasks
    )


def preserved_task_lease_holder_stable(now: int, a: State, b: State) -> bool:
    return all(
        (u := b.task(t.id)) is None
        or not (t.state == ACQUIRED and u.state == ACQUIRED and u.version == t.version)
        or (u.pid == t.pid and u.ttl == t.ttl)
        for t in a.tasks
    )


def consistent_task_lease_fields_move_together(now: int, a: State, b: State) -> bool:
    for t in a.tasks:
        u = b.task(t.id)
        if u is None:
            continue
        lease_u = (u.pid, u.ttl, u.expires_at)
        ok = (
            lease_u == (t.pid, t.ttl, t.expires_at)
            or (t.state != ACQUIRED and u.state == ACQUIRED and None not in lease_u)
            or (t.state == ACQUIRED and u.state != ACQUIRED and lease_u == (None, None, None))
            or (t.state == ACQUIRED and u.state == ACQUIRED and (u.pid, u.ttl) == (t.pid, t.ttl))
        )
        if not ok:
            return False
    return True


def monotone_task_resumes_grow_or_clear(now: int, a: State, b: State) -> bool:
    return all(
        (u := b.task(t.id)) is None or not u.resumes or subset(t.resumes, u.resumes)
        for t in a.tasks
    )


def consistent_task_resumes_cleared_only_on_dispatch_or_park(now: int, a: State, b: State) -> bool:
    return all(
        (u := b.task(t.id)) is None
        or not (t.resumes and not u.resumes)
        or u.state in (ACQUIRED, SUSPENDED, FULFILLED)
        for t in a.tasks
    )


def preserved_no_dead_dispatch(now: int, a: State, b: State) -> bool:
    return all(
        u.state != PENDING
        or ((t := a.task(u.id)) is not None and t.state == PENDING)
        or (p := b.promise(u.id)) is None
        or project(p, now).state == PENDING
        for u in b.tasks
    )


def preserved_execute_only_for_live_task(now: int, a: State, b: State) -> bool:
    return all(
        _had_execute(a, f.message.task_id, f.message.version, f.address)
        or (p := b.promise(f.message.task_id)) is None
        or project(p, now).state == PENDING
        for f in b.outbox
        if isinstance(f.message, Execute)
    )


def consistent_promise_settlement_stamp(now: int, a: State, b: State) -> bool:
    for p in a.promises:
        if p.state != PENDING:
            continue
        q = b.promise(p.id)
        if q is None:
            return False
        client = q.settled_at == now and now < q.timeout_at and q.state != REJECTED_TIMEDOUT
        deadline = (
            q.settled_at == q.timeout_at
            and q.timeout_at <= now
            and q.state == (RESOLVED if is_timer(q.tags) else REJECTED_TIMEDOUT)
            and q.value == p.value
        )
        if not (q.state == PENDING or client or deadline):
            return False
    return True


def preserved_timedout_is_server_owned(now: int, a: State, b: State) -> bool:
    return all(
        p.state != PENDING
        or (q := b.promise(p.id)) is None
        or q.state != REJECTED_TIMEDOUT
        or (p.timeout_at <= now and q.settled_at == p.timeout_at)
        for p in a.promises
    )


def consistent_new_promise_born_clean(now: int, a: State, b: State) -> bool:
    for q in b.promises:
        if a.promise(q.id) is not None:
            continue
        if q.callbacks or q.listeners or q.created_at > now or not q.value.is_empty():
            return False
        live = q.state == PENDING and q.settled_at is None and q.created_at < q.timeout_at
        dead = (
            q.settled_at == q.timeout_at
            and q.created_at == q.timeout_at
            and q.timeout_at <= now
            and q.state == (RESOLVED if is_timer(q.tags) else REJECTED_TIMEDOUT)
        )
        if not (live or dead):
            return False
    return True


def consistent_task_acquisition_is_atomic(now: int, a: State, b: State) -> bool:
    return all(
        (u := b.task(t.id)) is None
        or not (t.state != ACQUIRED and u.state == ACQUIRED)
        or (
            t.state == PENDING
            and t.version < u.version
            and u.pid is not None
            and u.ttl is not None
            and u.expires_at == now + u.ttl
            and u.retry_at is None
            and not u.resumes
        )
        for t in a.tasks
    )


def consistent_task_lease_deadline_is_now_plus_ttl(now: int, a: State, b: State) -> bool:
    return all(
        u.expires_at is None
        or u.expires_at == now + (u.ttl or 0)
        or (
            (t := a.task(u.id)) is not None
            and t.expires_at == u.expires_at
            and t.ttl == u.ttl
            and t.state == u.state
        )
        for u in b.tasks
    )


def consistent_task_pending_entry_arms_retry(now: int, a: State, b: State) -> bool:
    return all(
        (u := b.task(t.id)) is None
        or not (t.state != PENDING and u.state == PENDING)
        or u.retry_at == now
        for t in a.tasks
    )


def consistent_task_retry_rearm_only_when_due(now: int, a: State, b: State) -> bool:
    return all(
        (u := b.task(t.id)) is None
        or not (t.state == PENDING and u.state == PENDING and u.retry_at != t.retry_at)
        or (t.retry_at is not None and t.retry_at <= now)
        for t in a.tasks
    )


def monotone_task_retry_rearm_advances(now: int, a: State, b: State) -> bool:
    return all(
        t.state != PENDING
        or (u := b.task(t.id)) is None
        or u.state != PENDING
        or u.retry_at == t.retry_at
        or (u.retry_at is not None and now < u.retry_at)
        for t in a.tasks
    )


def consistent_task_wake_records_resume(now: int, a: State, b: State) -> bool:
    return all(
        (u := b.task(t.id)) is None
        or not (t.state == SUSPENDED and u.state == PENDING)
        or (u.resumes and u.retry_at == now and u.version == t.version)
        for t in a.tasks
    )


# ========================================================================= the catalogue

STATE_PROPERTIES: dict[str, StateProperty] = {
    f.__name__: f
    for f in (
        well_formed_promise_created_at_lte_timeout_at,  # 1
        well_formed_promise_pending_created_before_deadline,
        well_formed_promise_settled_at_lte_timeout_at,
        well_formed_promise_created_at_lte_settled_at,
        well_formed_promise_settled_at_iff_not_pending,  # 5
        well_formed_promise_pending_has_no_value,
        well_formed_promise_deadline_verdict_matches_timer_tag,
        well_formed_promise_deadline_settlement_has_no_value,
        well_formed_promise_timer_not_targeted,
        well_formed_promise_timedout_is_server_owned,  # 10
        well_formed_promise_callbacks_unique,
        well_formed_promise_listeners_unique,
        well_formed_promise_obligations_require_external,
        well_formed_promise_awaiter_is_not_self,
        well_formed_promise_created_at_lte_now,  # 15
        well_formed_promise_settled_at_lte_now,
        well_formed_task_acquired_iff_has_pid,
        well_formed_task_acquired_iff_has_ttl,
        well_formed_task_acquired_iff_has_expires_at,
        well_formed_task_pending_iff_has_retry_at,  # 20
        well_formed_task_fulfilled_is_cleared,
        well_formed_task_suspended_is_cleared,
        well_formed_task_halted_is_cleared,
        well_formed_task_suspended_has_no_resumes,
        well_formed_task_resumes_unique,  # 25
        well_formed_task_acquired_version_positive,
        well_formed_schedule_promise_tags_not_timer_targeted,
        well_formed_schedule_created_at_lte_next_run_at,
        well_formed_schedule_created_at_lte_last_run_at,
        well_formed_schedule_last_run_at_lt_next_run_at,  # 30
        well_formed_store_promise_ids_unique,
        well_formed_store_task_ids_unique,
        well_formed_store_schedule_ids_unique,
        well_formed_store_outbox_keys_unique,
        consistent_task_iff_targeted_promise,  # 35
        consistent_settled_promise_has_fulfilled_task,
        consistent_callback_awaiter_is_targeted,
        consistent_listener_addresses_deliverable,
        consistent_outbox_execute_names_existing_task,
        consistent_outbox_never_ahead,  # 40
        consistent_outbox_execute_address_is_target_tag,
        consistent_outbox_unblock_names_settled_promise,
        consistent_outbox_unblock_address_deliverable,
        consistent_settled_task_promise_settled,
        consistent_suspended_task_holds_rung,  # 45
    )
}

TRANS_PROPERTIES: dict[str, TransProperty] = {
    f.__name__: f
    for f in (
        preserved_promise_birth_fields_immutable,  # 46
        preserved_settled_promise_record,
        monotone_promise_set_grows,
        monotone_task_set_grows,
        monotone_task_version_increases_only_on_acquisition,  # 50
        preserved_fulfilled_task,
        preserved_promise_state_frozen_once_settled,
        preserved_promise_settlement_is_one_way,
        consistent_promise_settled_at_moves_with_state,
        preserved_promise_value_until_settlement,  # 55
        preserved_promise_no_duplicate_ids,
        monotone_promise_callbacks_grow_while_pending,
        monotone_promise_callbacks_shrink_once_settled,
        monotone_promise_listeners_grow_while_pending,
        monotone_promise_listeners_shrink_once_settled,  # 60
        consistent_promise_state_edge_admissible,
        consistent_task_state_edge_admissible,
        preserved_task_acquisition_only_from_pending,
        preserved_task_suspension_only_from_acquired,
        preserved_task_halted_only_reenters_via_pending,  # 65
        consistent_settlement_fulfils_task,
        consistent_task_fulfilment_needs_settlement,
        consistent_obligation_discharge_requires_settled,
        consistent_callback_consumption_resumes_awaiter,
        consistent_listener_consumption_enqueues_unblock,  # 70
        consistent_wake_follows_callback_consumption,
        consistent_suspension_registers_callback,
        consistent_task_birth_couples_promise_birth,
        monotone_outbox_keys_never_disappear,
        consistent_new_execute_matches_task_and_target,  # 75
        consistent_new_unblock_carries_stored_record,
        consistent_new_unblock_discharges_its_listener,
        preserved_schedule_birth_fields_immutable,
        consistent_task_birth_state,
        consistent_task_lease_released_atomically,  # 80
        preserved_task_lease_holder_stable,
        consistent_task_lease_fields_move_together,
        monotone_task_resumes_grow_or_clear,
        consistent_task_resumes_cleared_only_on_dispatch_or_park,
        preserved_no_dead_dispatch,  # 85
        preserved_execute_only_for_live_task,
        consistent_promise_settlement_stamp,
        preserved_timedout_is_server_owned,
        consistent_new_promise_born_clean,
        consistent_task_acquisition_is_atomic,  # 90
        consistent_task_lease_deadline_is_now_plus_ttl,
        consistent_task_pending_entry_arms_retry,
        consistent_task_retry_rearm_only_when_due,
        monotone_task_retry_rearm_advances,
        consistent_task_wake_records_resume,  # 95
    )
}

assert len(STATE_PROPERTIES) == 45 and len(TRANS_PROPERTIES) == 50


def state_failures(now: int, s: State) -> list[str]:
    """The names of the state properties ``s`` breaks at ``now``."""
    return [name for name, f in STATE_PROPERTIES.items() if not f(now, s)]


def trans_failures(now: int, a: State, b: State, skip: Iterable[str] = ()) -> list[str]:
    """The names of the transition properties the step ``a → b`` at ``now`` breaks."""
    skipped = set(skip)
    return [n for n, f in TRANS_PROPERTIES.items() if n not in skipped and not f(now, a, b)]


# ======================================================= outside the catalogue (§6.3)

TASK_INTERNAL_EDGES = {
    (PENDING, PENDING),
    (PENDING, FULFILLED),
    (ACQUIRED, PENDING),
    (ACQUIRED, ACQUIRED),
    (ACQUIRED, FULFILLED),
    (SUSPENDED, PENDING),
    (SUSPENDED, SUSPENDED),
    (SUSPENDED, FULFILLED),
    (HALTED, HALTED),
    (HALTED, FULFILLED),
    (FULFILLED, FULFILLED),
}


def consistent_task_state_edge_internal_admissible(now: int, a: State, b: State) -> bool:
    """Provenance: a background step never acquires, suspends, halts or continues."""
    return all(
        (u := b.task(t.id)) is None or (t.state, u.state) in TASK_INTERNAL_EDGES for t in a.tasks
    )


def consistent_promise_state_edge_internal_admissible(now: int, a: State, b: State) -> bool:
    """Provenance: a background step settles a promise only by its deadline."""
    return all(
        (q := b.promise(p.id)) is None
        or p.state == q.state
        or (
            p.state == PENDING
            and (q.state == REJECTED_TIMEDOUT or (q.state == RESOLVED and is_timer(p.tags)))
        )
        for p in a.promises
    )


INTERNAL_PROPERTIES: dict[str, TransProperty] = {
    f.__name__: f
    for f in (
        consistent_task_state_edge_internal_admissible,
        consistent_promise_state_edge_internal_admissible,
    )
}


def internal_failures(now: int, a: State, b: State) -> list[str]:
    """Provenance failures of a step made only of internal steps (a ``debug.tick``)."""
    return [n for n, f in INTERNAL_PROPERTIES.items() if not f(now, a, b)]


def well_formed_task_ttl_positive(now: int, s: State) -> bool:
    """Known gap: ``ttl = 0`` is accepted (the lease expires at grant)."""
    return all(t.ttl is None or t.ttl > 0 for t in s.tasks)


def well_formed_promise_target_is_nonempty(now: int, s: State) -> bool:
    """Known gap: ``resonate:target = ""`` is accepted (execute goes to ``""``)."""
    return all(p.tags.get(TARGET, "x") != "" for p in s.promises)


def well_formed_promise_delay_before_deadline(now: int, s: State) -> bool:
    """Known gap: a delay at or after the deadline means the task is never dispatched."""
    return all(
        DELAY not in p.tags or not targeted(p.tags) or parse_nat(p.tags[DELAY]) < p.timeout_at
        for p in s.promises
    )


def well_formed_config_retry_positive(retry_timeout: int = RETRY_TIMEOUT) -> bool:
    """A condition on configuration, not on state: ``retryTimeout > 0``."""
    return retry_timeout > 0


KNOWN_GAPS: dict[str, StateProperty] = {
    f.__name__: f
    for f in (
        well_formed_task_ttl_positive,
        well_formed_promise_target_is_nonempty,
        well_formed_promise_delay_before_deadline,
    )
}


# ==================================================== where the catalogue is too strong

# Two catalogue entries are false of runs the specification's own machine makes; its
# bounded sweeps (scripts of length ≤ 3, no schedules, §6.5) cannot reach either run.
# Each is kept exactly as stated above, and a step that breaks it is accepted only if
# it keeps the weaker claim below, which is what the run actually does.


def consistent_suspension_registers_callback_weak(now: int, a: State, b: State) -> bool:
    """Entering suspended ⇒ a pending promise *holds* the task's callback (new or not).

    ``promise.register_callback`` (P-04) accepts an awaiter whose task is acquired, so a
    task can already be on the awaited promise's ledger when it suspends on it; T-06
    then adds nothing (``addCallback`` deduplicates) and the strict entry, which wants
    a *new* callback, fails: create a targeted ``a`` (task.create), an external ``b``,
    ``register_callback(b, a)``, ``task.suspend(a, [b])`` — four steps."""
    for u in b.tasks:
        t = a.task(u.id)
        if u.state != SUSPENDED or (t is not None and t.state == SUSPENDED):
            continue
        if not any(u.id in q.callbacks and q.state == PENDING for q in b.promises):
            return False
    return True


def preserved_no_dead_dispatch_weak(now: int, a: State, b: State) -> bool:
    """A task newly pending has a live promise, unless both were born in this step.

    r7's catch-up creates every missed occurrence as if at its own instant t (SPEC.md
    §5), so a backlogged targeted occurrence whose deadline has already passed is born
    with a pending task while its promise reads dead at ``now``.  Nothing is
    dispatched: r1 times it out before r6 may fire."""
    return all(
        u.state != PENDING
        or ((t := a.task(u.id)) is not None and t.state == PENDING)
        or a.promise(u.id) is None
        or (p := b.promise(u.id)) is None
        or project(p, now).state == PENDING
        for u in b.tasks
    )


SPEC_FINDINGS: dict[str, TransProperty] = {
    "consistent_suspension_registers_callback": consistent_suspension_registers_callback_weak,
    "preserved_no_dead_dispatch": preserved_no_dead_dispatch_weak,
}


def trans_failures_with_findings(
    now: int, a: State, b: State, skip: Iterable[str] = ()
) -> tuple[list[str], list[str]]:
    """(failures, findings): a failure of an entry in :data:`SPEC_FINDINGS` that keeps
    the weaker claim is a finding (the specification's machine does the same), not a
    failure."""
    bad = trans_failures(now, a, b, skip)
    found = [n for n in bad if n in SPEC_FINDINGS and SPEC_FINDINGS[n](now, a, b)]
    return [n for n in bad if n not in found], found
