"""Projection, the task view and the shared read/write helpers (SPEC.md §2.3, §3).

Client requests use the *projected* read discipline: reads serve the projection and
persist nothing (``mat = False``).  Internal steps *touch*: they persist the projection.
Both give identical responses (SPEC.md §1); projecting keeps reads write-free.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from msgspec.structs import replace

from troth.machine.tx import Tx
from troth.protocol.records import (
    PENDING,
    REJECTED_TIMEDOUT,
    RESOLVED,
    TAG_DELAY,
    Promise,
    Tags,
    Task,
    TaskState,
    Value,
    parse_nat,
)

# The machine's names for the task states (defined once, in ``protocol.records``).
FULFILLED: Final = TaskState.FULFILLED.value
ACQUIRED: Final = TaskState.ACQUIRED.value
SUSPENDED: Final = TaskState.SUSPENDED.value
HALTED: Final = TaskState.HALTED.value
TASK_PENDING: Final = TaskState.PENDING.value

#: Ids beginning with this character are reserved for schedule occurrences (§5.3):
#: no client request may create one, so a client cannot pre-create an occurrence.
RESERVED_ID_PREFIX: Final = "~"


class Response(NamedTuple):
    """A status and the ``data`` to send: a dict for 2xx/300, a message string otherwise."""

    status: int
    data: object


def error(status: int, message: str) -> Response:
    return Response(status, message)


def project(p: Promise, now: int) -> Promise:
    """Fact P: a pending promise past its deadline reads as settled at ``timeoutAt``."""
    if p.state == PENDING and p.timeout_at <= now:
        return replace(
            p, state=RESOLVED if p.is_timer else REJECTED_TIMEDOUT, settled_at=p.timeout_at
        )
    return p


def fulfil(t: Task) -> Task:
    """The fulfilled shape: lease and dispatch fields and resumes cleared, version kept."""
    return replace(
        t, state=FULFILLED, pid=None, ttl=None, expires_at=None, retry_at=None, resumes=()
    )


def view(t: Task, p: Promise) -> Task:
    """Fact T: a task whose (projected) promise is settled reads as fulfilled."""
    if p.state != PENDING and t.state != FULFILLED:
        return fulfil(t)
    return t


def set_settled(tx: Tx, p: Promise) -> None:
    """Write ``p``; settling a promise fulfils its task in the same step (§10.21)."""
    tx.set_promise(p)
    if p.state != PENDING:
        t = tx.get_task(p.id)
        if t is not None and t.state != FULFILLED:
            tx.set_task(fulfil(t))


def read_promise(tx: Tx, id: str, now: int, *, touch: bool = False) -> Promise | None:
    """``readPromise``: the projected promise; ``touch`` persists a changed projection."""
    p = tx.get_promise(id)
    if p is None:
        return None
    q = project(p, now)
    if touch and q is not p:
        set_settled(tx, q)
    return q


class TaskRead(NamedTuple):
    task: Task
    promise: Promise | None


def read_task(tx: Tx, id: str, now: int, *, touch: bool = False) -> TaskRead | None:
    """``readTask``: the task as viewed through its projected promise."""
    t = tx.get_task(id)
    if t is None:
        return None
    p = read_promise(tx, id, now, touch=touch)
    if p is None:
        return TaskRead(t, None)
    if touch:
        # set_settled already fulfilled the stored task if the projection changed.
        stored = tx.get_task(id)
        t = stored if stored is not None else t
    return TaskRead(view(t, p), p)


def new_promise(tx: Tx, id: str, timeout_at: int, param: Value, tags: Tags, now: int) -> Promise:
    """``createPromise``: live birth, or born dead when ``timeoutAt <= now`` (§3, §10.3)."""
    targeted = "resonate:target" in tags
    if timeout_at > now:
        p = Promise(
            id=id,
            state=PENDING,
            param=param,
            value=Value(),
            tags=tags,
            timeout_at=timeout_at,
            created_at=now,
        )
        tx.set_promise(p)
        if targeted:
            delay = tags.get(TAG_DELAY)
            retry_at = max(parse_nat(delay), now) if delay is not None else now
            tx.set_task(Task(id=id, state=TASK_PENDING, version=0, retry_at=retry_at))
        return p
    p = Promise(
        id=id,
        state=RESOLVED if tags.get("resonate:timer") == "true" else REJECTED_TIMEDOUT,
        param=param,
        value=Value(),
        tags=tags,
        timeout_at=timeout_at,
        created_at=timeout_at,
        settled_at=timeout_at,
    )
    tx.set_promise(p)
    if targeted:
        tx.set_task(Task(id=id, state=FULFILLED, version=0))
    return p


def acquire(t: Task, pid: str, ttl: int, now: int) -> Task:
    """Entering ``acquired``: version + 1, a fresh lease, no retry, resumes cleared."""
    return replace(
        t,
        state=ACQUIRED,
        version=t.version + 1,
        pid=pid,
        ttl=ttl,
        expires_at=now + ttl,
        retry_at=None,
        resumes=(),
    )


def to_pending(t: Task, now: int) -> Task:
    """Entering ``pending``: the lease ends and dispatch is armed at ``now`` (§10.16)."""
    return replace(t, state=TASK_PENDING, pid=None, ttl=None, expires_at=None, retry_at=now)
