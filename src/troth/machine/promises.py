"""Promise requests P-01 … P-05 (SPEC.md §4.1), one function each, guards in order.

Guard order is part of the protocol: validation (400) before existence (404) before
state refusals (409/422).
"""

from __future__ import annotations

from msgspec.structs import replace

from troth.machine.state import (
    RESERVED_ID_PREFIX,
    Response,
    error,
    new_promise,
    read_promise,
    set_settled,
)
from troth.machine.tx import Tx
from troth.protocol import requests as rq
from troth.protocol.address import address_valid
from troth.protocol.records import (
    PENDING,
    SETTABLE_STATES,
    TAG_TARGET,
    Promise,
    Value,
    is_timer_targeted,
)


def promise_body(p: Promise) -> dict[str, object]:
    return {"promise": p.record()}


def creation_refusal(req: rq.PromiseCreate) -> str | None:
    """The 400s every promise birth door shares (timer + target; reserved ids)."""
    if is_timer_targeted(req.tags):
        return "resonate:timer and resonate:target cannot be combined"
    if req.id.startswith(RESERVED_ID_PREFIX):
        return f"ids beginning with {RESERVED_ID_PREFIX!r} are reserved for schedule occurrences"
    if not req.id:
        return "id must not be empty"
    return None


def promise_get(tx: Tx, req: rq.PromiseGet, now: int) -> Response:
    p = read_promise(tx, req.id, now)
    if p is None:
        return error(404, "Promise not found")
    return Response(200, promise_body(p))


def promise_create(tx: Tx, req: rq.PromiseCreate, now: int) -> Response:
    refusal = creation_refusal(req)
    if refusal is not None:
        return error(400, refusal)
    p = read_promise(tx, req.id, now)
    if p is None:
        p = new_promise(tx, req.id, req.timeout_at, req.param, req.tags, now)
    return Response(200, promise_body(p))


def settle(tx: Tx, id: str, state: str, req_value: Value, now: int) -> Response:
    """Steps 2–4 of P-03, shared by ``promise.settle`` and a fenced settle."""
    p = read_promise(tx, id, now)
    if p is None:
        return error(404, "Promise not found")
    if p.state == PENDING:
        p = replace(p, state=state, value=req_value, settled_at=now)
        set_settled(tx, p)
    return Response(200, promise_body(p))


def settle_refusal(state: str) -> str | None:
    if state not in SETTABLE_STATES:
        return (
            f"state {state!r} cannot be set by a client: "
            "expected resolved, rejected or rejected_canceled"
        )
    return None


def promise_settle(tx: Tx, req: rq.PromiseSettle, now: int) -> Response:
    refusal = settle_refusal(req.state)
    if refusal is not None:
        return error(400, refusal)
    return settle(tx, req.id, req.state, req.value, now)


def promise_register_callback(tx: Tx, req: rq.PromiseRegisterCallback, now: int) -> Response:
    if req.awaited == req.awaiter:
        return error(400, "a promise cannot await itself")
    awaited = read_promise(tx, req.awaited, now)
    if awaited is None:
        return error(404, "Awaited promise not found")
    awaiter = read_promise(tx, req.awaiter, now)
    if awaiter is None:
        return error(422, "Awaiter promise not found")
    if TAG_TARGET not in awaiter.tags:
        return error(422, "Awaiter promise has no resonate:target tag")
    if not awaited.external:
        return error(422, "Awaited promise is not external and cannot take callbacks")
    if (
        awaited.state == PENDING
        and awaiter.state == PENDING
        and req.awaiter not in awaited.callbacks
    ):
        tx.set_promise(replace(awaited, callbacks=(*awaited.callbacks, req.awaiter)))
    return Response(200, promise_body(awaited))


def promise_register_listener(tx: Tx, req: rq.PromiseRegisterListener, now: int) -> Response:
    if not address_valid(req.address):
        return error(400, f"Invalid listener address: {req.address!r}")
    p = read_promise(tx, req.awaited, now)
    if p is None:
        return error(404, "Awaited promise not found")
    if not p.external:
        return error(422, "Awaited promise is not external and cannot take listeners")
    if p.state == PENDING and req.address not in p.listeners:
        tx.set_promise(replace(p, listeners=(*p.listeners, req.address)))
    return Response(200, promise_body(p))
