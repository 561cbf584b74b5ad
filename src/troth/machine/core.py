"""The machine's two entry points: one client request, or one timer pass.

``handle`` runs the request's handler and then, in the same transaction, every
internal step its writes enabled.  ``tick`` fires every step due at ``now``.  Both are
pure over the ``Tx`` they are given: no clock, no I/O (ARCHITECTURE rule 1, 2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from troth.machine import promises, schedules, search, tasks
from troth.machine.internal import Config, Recorder, fire_due, settle_enabled
from troth.machine.state import Response, error
from troth.machine.tx import Tx
from troth.protocol import requests as rq
from troth.protocol.records import EARLIEST
from troth.protocol.requests import BadRequest, decode_data

Handler = Callable[[Tx, Any, int], Response]

HANDLERS: dict[type[rq.Req], Handler] = {
    rq.PromiseGet: promises.promise_get,
    rq.PromiseCreate: promises.promise_create,
    rq.PromiseSettle: promises.promise_settle,
    rq.PromiseRegisterCallback: promises.promise_register_callback,
    rq.PromiseRegisterListener: promises.promise_register_listener,
    rq.PromiseSearch: search.promise_search,
    rq.TaskGet: tasks.task_get,
    rq.TaskCreate: tasks.task_create,
    rq.TaskAcquire: tasks.task_acquire,
    rq.TaskHeartbeat: tasks.task_heartbeat,
    rq.TaskSuspend: tasks.task_suspend,
    rq.TaskFulfill: tasks.task_fulfill,
    rq.TaskRelease: tasks.task_release,
    rq.TaskHalt: tasks.task_halt,
    rq.TaskContinue: tasks.task_continue,
    rq.TaskSearch: search.task_search,
    rq.ScheduleGet: schedules.schedule_get,
    rq.ScheduleCreate: schedules.schedule_create,
    rq.ScheduleDelete: schedules.schedule_delete,
    rq.ScheduleSearch: search.schedule_search,
}

#: Kinds that never write: they may be served without the writer.
READ_ONLY = frozenset(
    {rq.PromiseGet, rq.TaskGet, rq.ScheduleGet, rq.PromiseSearch, rq.TaskSearch, rq.ScheduleSearch}
)


def _action_keys(req: rq.TaskSuspend | rq.TaskFence | rq.TaskCreate) -> tuple[str, ...]:
    """The promises a suspend's, fence's or create's actions name (a suspend's
    awaited, a fence's or a create's promise), after the task's own id for a suspend
    or a fence; an action that does not decode is refused later, before any read."""
    keys = [req.id] if isinstance(req, rq.TaskSuspend | rq.TaskFence) else []
    actions = req.actions if isinstance(req, rq.TaskSuspend) else [req.action]
    for action in actions:
        try:
            inner = decode_data(action.kind, action.data)
        except BadRequest:
            continue
        for name in ("awaited", "id"):
            value = getattr(inner, name, None)
            if isinstance(value, str):
                keys.append(value)
                break
    return tuple(keys)


def _no_keys(req: Any) -> tuple[str, ...]:
    return ()  # schedule ids are another table's


#: Requests whose keys are not just their ``id``, by exact type: a dict lookup per
#: request where a chain of isinstance checks cost the event loop ~3 µs (measured).
_LOCK_KEYS: Final[dict[type, Callable[[Any], tuple[str, ...]]]] = {
    rq.PromiseRegisterCallback: lambda req: (req.awaited, req.awaiter),
    rq.PromiseRegisterListener: lambda req: (req.awaited,),
    rq.TaskHeartbeat: lambda req: tuple(t.id for t in req.tasks),
    rq.TaskSuspend: _action_keys,
    rq.TaskFence: _action_keys,
    rq.TaskCreate: _action_keys,
    rq.ScheduleGet: _no_keys,
    rq.ScheduleCreate: _no_keys,
    rq.ScheduleDelete: _no_keys,
}


def lock_keys(req: rq.Req) -> tuple[str, ...]:
    """The promise ids (a task has its promise's id) a request reads first.

    Known from the request alone, so a store shared between nodes can lock them in
    sorted order up front (``Job.keys``); rows reached later (a settle's awaiters,
    which the PostgreSQL store reads right after these, all at once) are locked as
    the handler reads them.
    """
    keys = _LOCK_KEYS.get(type(req))
    if keys is not None:
        return keys(req)
    id = getattr(req, "id", None)
    return (id,) if isinstance(id, str) else ()


def request_ids(req: rq.Req) -> tuple[str, ...]:
    """The ids a request names, for a log line or a trace span: its promise ids
    (:func:`lock_keys`), or a schedule request's schedule id."""
    keys = lock_keys(req)
    if keys:
        return keys
    id = getattr(req, "id", None)
    return (id,) if isinstance(id, str) else ()


def settled_keys(req: rq.Req, keys: tuple[str, ...]) -> tuple[str, ...]:
    """The ids among ``keys`` (:func:`lock_keys`) whose promise ``req`` may settle,
    and whose awaiters it then resumes: a store shared between nodes reads those
    awaiters up front (``Job.settles``) instead of one by one mid-batch."""
    kind = type(req)
    if kind is rq.PromiseSettle or kind is rq.TaskFulfill:
        return keys
    if isinstance(req, rq.TaskFence) and req.action.kind == "promise.settle":
        return keys[1:]  # the task's own id comes first
    return ()


def handle(tx: Tx, req: rq.Req, now: int, config: Config, head: dict[str, Any]) -> Response:
    """Answer one client request at ``now`` and fire what it enabled."""
    rec = Recorder(tx)
    try:
        if isinstance(req, rq.TaskFence):
            response = tasks.task_fence(rec, req, now, head)
        else:
            handler = HANDLERS.get(type(req))
            if handler is None:
                return error(400, f"Unsupported request {type(req).__name__}")
            response = handler(rec, req, now)
    except BadRequest as exc:
        # Raised only by validation, before any write.
        return error(400, str(exc))
    if rec.promises or rec.tasks:
        settle_enabled(rec, now, config)
    return response


def read(tx: Tx, req: rq.Req, now: int) -> Response:
    """Answer one request of :data:`READ_ONLY` at ``now``: :func:`handle` without its
    recorder, which a read never needs (it writes nothing, so it enables nothing)."""
    try:
        return HANDLERS[type(req)](tx, req, now)
    except BadRequest as exc:
        return error(400, str(exc))


def tick(tx: Tx, now: int, config: Config, since: int = EARLIEST) -> int:
    """One timer pass: fire every step due at ``now`` (from ``since``: the timer's
    floor); returns how many objects were due."""
    return fire_due(Recorder(tx), now, config, since)
