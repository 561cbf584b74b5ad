"""Task requests T-01 … T-10 (SPEC.md §4.2), one function each, guards in order.

Every guard reads the task *view* through the projected promise (T̂, P̂), so a task
whose promise has timed out reads ``fulfilled`` and fails the state checks (§10.1).
"""

from __future__ import annotations

import msgspec
from msgspec.structs import replace

from troth.machine.promises import (
    creation_refusal,
    promise_create,
    promise_settle,
    settle_refusal,
)
from troth.machine.state import (
    ACQUIRED,
    FULFILLED,
    HALTED,
    SUSPENDED,
    TASK_PENDING,
    Response,
    TaskRead,
    acquire,
    error,
    new_promise,
    project,
    read_promise,
    read_task,
    set_settled,
    to_pending,
)
from troth.machine.tx import Tx
from troth.protocol import requests as rq
from troth.protocol.records import PENDING, TAG_BRANCH, TAG_TARGET, Promise, is_timer_targeted
from troth.protocol.requests import BadRequest, decode_action

#: Upper bound on the promises returned as ``preload`` in one response.
PRELOAD_LIMIT = 1000


def preload(tx: Tx, p: Promise, now: int) -> list[object]:
    """The other promises of the task promise's ``resonate:branch`` (SDK-CLIENTS §2.4)."""
    branch = p.tags.get(TAG_BRANCH)
    if not branch:
        return []
    out: list[object] = []
    # The scan already answers as this transaction sees it (its own writes merged):
    # project those rows rather than read each sibling again (on PostgreSQL a point
    # read is a locked round trip per sibling).
    for q in tx.promises_in_branch(branch, PRELOAD_LIMIT + 1):
        if q.id != p.id and len(out) < PRELOAD_LIMIT:
            out.append(project(q, now).record())
    return out


def task_body(tx: Tx, r: TaskRead, now: int) -> dict[str, object]:
    assert r.promise is not None
    return {
        "task": r.task.record(),
        "promise": r.promise.record(),
        "preload": preload(tx, r.promise, now),
    }


def held(tx: Tx, id: str, version: int, now: int, state: str) -> TaskRead | Response:
    """The shared guard of versioned task calls: 404, then 409 for promise missing,
    wrong (viewed) state, dead promise, or version mismatch."""
    r = read_task(tx, id, now)
    if r is None:
        return error(404, "Task not found")
    if r.promise is None:
        return error(409, "Task has no promise")
    if r.task.state != state:
        return error(409, f"Task is {r.task.state}, not {state}")
    if r.promise.state != PENDING:
        return error(409, "Task promise is not pending")
    if r.task.version != version:
        return error(409, f"Task version mismatch: current version is {r.task.version}")
    return r


def task_get(tx: Tx, req: rq.TaskGet, now: int) -> Response:
    r = read_task(tx, req.id, now)
    if r is None or r.promise is None:
        return error(404, "Task not found")
    return Response(200, {"task": r.task.record()})


def task_create(tx: Tx, req: rq.TaskCreate, now: int) -> Response:
    action = decode_action(req.action, ("promise.create",))
    assert isinstance(action, rq.PromiseCreate)
    if TAG_TARGET not in action.tags:
        return error(400, "task.create needs a promise with a resonate:target tag")
    refusal = creation_refusal(action)
    if refusal is not None:
        return error(400, refusal)
    p = read_promise(tx, action.id, now)
    if p is None:
        p = new_promise(tx, action.id, action.timeout_at, action.param, action.tags, now)
        t = tx.get_task(p.id)
        assert t is not None
        if p.state == PENDING:
            t = acquire(t, req.pid, req.ttl, now)
            # Born acquired at version 1: a pending v0 task acquired in the same step.
            tx.set_task(t)
        return Response(200, task_body(tx, TaskRead(t, p), now))
    if TAG_TARGET not in p.tags:
        return error(422, "The promise does not have a resonate:target tag")
    r = read_task(tx, p.id, now)
    if r is None:
        return error(409, "Promise exists without a task")
    if r.task.state == FULFILLED:
        return Response(200, task_body(tx, r, now))
    if r.task.state == TASK_PENDING:
        t = acquire(r.task, req.pid, req.ttl, now)
        tx.set_task(t)
        return Response(200, task_body(tx, TaskRead(t, r.promise), now))
    return error(409, f"Task already exists and is {r.task.state}")


def task_acquire(tx: Tx, req: rq.TaskAcquire, now: int) -> Response:
    r = held(tx, req.id, req.version, now, TASK_PENDING)
    if isinstance(r, Response):
        return r
    t = acquire(r.task, req.pid, req.ttl, now)
    tx.set_task(t)
    return Response(200, task_body(tx, TaskRead(t, r.promise), now))


def task_fence(tx: Tx, req: rq.TaskFence, now: int, head: dict[str, object]) -> Response:
    action = decode_action(req.action, ("promise.create", "promise.settle"))
    assert isinstance(action, rq.PromiseCreate | rq.PromiseSettle)
    if action.id == req.id:
        return error(400, "task.fence may not act on the task's own promise; use task.fulfill")
    if isinstance(action, rq.PromiseCreate) and is_timer_targeted(action.tags):
        action = sdk_sleep(action)
    r = held(tx, req.id, req.version, now, ACQUIRED)
    if isinstance(r, Response):
        return r
    if isinstance(action, rq.PromiseCreate):
        inner = promise_create(tx, action, now)
    else:
        inner = promise_settle(tx, action, now)
    inner_head: dict[str, object] = {"status": inner.status}
    corr = req.action.head.get("corrId")
    if isinstance(corr, str):
        inner_head = {"corrId": corr, "status": inner.status}
    inner_head["version"] = head.get("version", "2026-04-01")
    # ``preload`` is empty, as both published SDKs' own in-process servers answer a
    # fence: the worker already holds every sibling (from the acquire's preload or
    # its own fences), and listing the branch on every fence made a workflow of N
    # sequential steps read, encode and send O(N²) promises (docs/performance-notes.md,
    # "SDK workflows").
    return Response(
        200,
        {
            "action": {"kind": req.action.kind, "head": inner_head, "data": inner.data},
            "preload": [],
        },
    )


def sdk_sleep(action: rq.PromiseCreate) -> rq.PromiseCreate:
    """Both published SDKs create ``ctx.sleep`` timers through a fence with a target
    (so that, on servers without durable timers, a worker wakes the workflow).

    SPEC.md refuses timer + target (400), which would break every durable sleep of
    the real clients; a timer needs no worker here (its deadline resolves it, r1), so
    troth stores it as a plain timer, without the target.  See docs/protocol.md.
    """
    tags = {k: v for k, v in action.tags.items() if k != TAG_TARGET}
    return msgspec.structs.replace(action, tags=tags)


def task_heartbeat(tx: Tx, req: rq.TaskHeartbeat, now: int) -> Response:
    for ref in req.tasks:
        r = read_task(tx, ref.id, now)
        if (
            r is not None
            and r.promise is not None
            and r.task.state == ACQUIRED
            and r.task.version == ref.version
            and r.task.pid == req.pid
            and r.promise.state == PENDING
            and r.task.ttl is not None
        ):
            tx.set_task(replace(r.task, expires_at=now + r.task.ttl))
    return Response(200, {})


def task_suspend(tx: Tx, req: rq.TaskSuspend, now: int) -> Response:
    if not req.actions:
        return error(400, "task.suspend needs at least one action")
    awaited: list[str] = []
    for action in req.actions:
        a = decode_action(action, ("promise.register_callback",))
        assert isinstance(a, rq.PromiseRegisterCallback)
        awaited.append(a.awaited)
    if req.id in awaited:
        return error(400, "a task cannot await its own promise")
    if len(set(awaited)) != len(awaited):
        return error(400, "duplicate awaited promise ids")
    r = held(tx, req.id, req.version, now, ACQUIRED)
    if isinstance(r, Response):
        return r
    promises: list[Promise] = []
    for id in awaited:
        p = read_promise(tx, id, now)
        if p is None:
            return error(422, f"Awaited promise {id} not found")
        if not p.external:
            return error(422, f"Awaited promise {id} is not external")
        promises.append(p)
    if any(p.state != PENDING for p in promises):
        if r.task.resumes:
            tx.set_task(replace(r.task, resumes=()))
        assert r.promise is not None
        return Response(300, {"preload": preload(tx, r.promise, now)})
    for p in promises:
        if req.id not in p.callbacks:
            tx.set_promise(replace(p, callbacks=(*p.callbacks, req.id)))
    tx.set_task(
        replace(
            r.task, state=SUSPENDED, pid=None, ttl=None, expires_at=None, retry_at=None, resumes=()
        )
    )
    return Response(200, {})


def task_fulfill(tx: Tx, req: rq.TaskFulfill, now: int) -> Response:
    action = decode_action(req.action, ("promise.settle",))
    assert isinstance(action, rq.FulfillSettle)
    refusal = settle_refusal(action.state)
    if refusal is not None:
        return error(400, refusal)
    r = held(tx, req.id, req.version, now, ACQUIRED)
    if isinstance(r, Response):
        return r
    assert r.promise is not None
    p = replace(r.promise, state=action.state, value=action.value, settled_at=now)
    set_settled(tx, p)
    return Response(200, {"promise": p.record()})


def task_release(tx: Tx, req: rq.TaskRelease, now: int) -> Response:
    r = held(tx, req.id, req.version, now, ACQUIRED)
    if isinstance(r, Response):
        return r
    tx.set_task(to_pending(r.task, now))
    return Response(200, {})


def task_halt(tx: Tx, req: rq.TaskHalt, now: int) -> Response:
    r = read_task(tx, req.id, now)
    if r is None or r.promise is None:
        return error(404, "Task not found")
    if r.task.state == FULFILLED:
        return error(409, "Task is fulfilled")
    if r.task.state != HALTED:
        tx.set_task(
            replace(r.task, state=HALTED, pid=None, ttl=None, expires_at=None, retry_at=None)
        )
    return Response(200, {})


def task_continue(tx: Tx, req: rq.TaskContinue, now: int) -> Response:
    r = read_task(tx, req.id, now)
    if r is None:
        return error(404, "Task not found")
    if r.task.state != HALTED:
        return error(409, f"Task is {r.task.state}, not halted")
    if r.promise is None:
        return error(404, "Task promise not found")
    if r.promise.state != PENDING:
        return error(409, "Task promise is not pending")
    tx.set_task(to_pending(r.task, now))
    return Response(200, {})


__all__ = ["BadRequest"]
