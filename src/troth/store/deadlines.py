"""Which deadline an object carries: what the timer fires, the same on every store.

A pending external promise times out at ``timeoutAt``; a pending task is re-offered
at ``retryAt``; an acquired task's lease ends at ``expiresAt``; a schedule runs at
``nextRunAt``.  Stores index exactly these (memory: heaps, SQL: partial indexes).
"""

from __future__ import annotations

from troth.protocol.records import PENDING, Promise, Task, TaskState
from troth.store.writes import Writes


def promise_deadline(p: Promise) -> int | None:
    return p.timeout_at if p.state == PENDING and p.external else None


def task_deadline(t: Task) -> int | None:
    if t.state == TaskState.PENDING:
        return t.retry_at
    if t.state == TaskState.ACQUIRED:
        return t.expires_at
    return None


def earliest_deadline(writes: Writes) -> int | None:
    """The earliest deadline a job's writes armed (a hint for the timer only)."""
    best: int | None = None
    for p in writes.promises.values():
        d = promise_deadline(p)
        if d is not None and (best is None or d < best):
            best = d
    for t in writes.tasks.values():
        d = task_deadline(t)
        if d is not None and (best is None or d < best):
            best = d
    for s in writes.schedules.values():
        if s is not None and (best is None or s.next_run_at < best):
            best = s.next_run_at
    return best
