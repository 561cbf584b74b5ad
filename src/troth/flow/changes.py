"""Setting and deleting a limit, and reading the limits with their use: jobs for the
engine's writer, so that a change commits with what it implies at once.

* A new limit counts the group's tasks acquired now as holding its slots (they were
  started before the limit and run on); tasks dispatched already and not yet
  acquired are let be: their ``task.acquire`` is checked as any other.
* A raised limit lets queued tasks through at once; a lowered one takes no slot
  back (tasks running keep running) and admits nothing until enough have freed.
* A deleted limit lets every queued task of its group through and forgets its slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from troth.flow.gate import admit
from troth.flow.limits import Limit, group_of, key_of
from troth.machine.state import ACQUIRED, TASK_PENDING
from troth.protocol.records import TAG_TARGET
from troth.store.base import Overlay

#: Acquired tasks one page of a new limit's count reads.
SCAN_PAGE: Final = 1000


def set_limit(limit: Limit, now: int) -> Callable[[Overlay], dict[str, Any]]:
    """The job that sets ``limit``; it answers the limit with its use."""

    def job(tx: Overlay) -> dict[str, Any]:
        known = {old.group: old for old in tx.backend.flow_limits()}
        tx.writes.limits = {limit.group: limit}
        old = known.get(limit.group)
        if old is None:
            _put_right(tx, limit.group)
        elif (old.rate, old.burst) != (limit.rate, limit.burst):
            tx.set_tat(limit.group, 0.0)  # a new bucket starts full
        admitted = admit(tx, now, limit)
        return {**usage(tx, limit), "admitted": admitted}

    return job


def seed_limits(limits: list[Limit], now: int) -> Callable[[Overlay], list[str]]:
    """The job that sets, at start, the limits of the ``flow_limits`` setting on the
    groups that have none in the store (a limit changed since with ``troth limits``
    stays as changed; nodes starting together set each group once).  It answers the
    groups it set."""

    def job(tx: Overlay) -> list[str]:
        known = {old.group for old in tx.backend.flow_limits()}
        fresh = [limit for limit in limits if limit.group not in known]
        if fresh:
            tx.writes.limits = {limit.group: limit for limit in fresh}
            for limit in fresh:
                _put_right(tx, limit.group)
                admit(tx, now, limit)
        return [limit.group for limit in fresh]

    return job


def read_limits(tx: Overlay) -> list[Limit]:
    """Every limit (a job that writes nothing)."""
    return tx.backend.flow_limits()


def reconcile(group: str) -> Callable[[Overlay], None]:
    """The job a node runs when it learns of a limit another node set: the group's
    slots put right (the node may have let a worker take, or seen end, a task of
    the group in the moment before it knew)."""

    def job(tx: Overlay) -> None:
        if any(limit.group == group for limit in tx.backend.flow_limits()):
            _put_right(tx, group)

    return job


def delete_limit(group: str, now: int) -> Callable[[Overlay], dict[str, Any] | None]:
    """The job that deletes the limit of ``group`` (None: it had none): every queued
    task is let through."""

    def job(tx: Overlay) -> dict[str, Any] | None:
        known = {old.group: old for old in tx.backend.flow_limits()}
        if group not in known:
            return None
        tx.writes.limits = {group: None}
        unlimited = Limit(group)
        admitted = admit(tx, now, unlimited)
        return {"group": group, "admitted": admitted}

    return job


def list_limits(tx: Overlay) -> list[dict[str, Any]]:
    """Every limit with its use (a job that writes nothing)."""
    return [usage(tx, limit) for limit in tx.backend.flow_limits()]


def usage(tx: Overlay, limit: Limit) -> dict[str, Any]:
    """A limit with its use: slots held, tasks queued (a set or delete job's own
    changes to the queue are only removals)."""
    removed = sum(1 for h in (tx.writes.held or {}).values() if h is None)
    shown: dict[str, Any] = {"group": limit.group, "concurrency": limit.concurrency}
    if limit.rate is not None:
        shown["rate"] = limit.rate
        shown["burst"] = limit.bucket
    if limit.per_key is not None:
        shown["perKey"] = limit.per_key
    return {
        **shown,
        "inUse": tx.flow_in_use(limit.group),
        "held": tx.backend.flow_held_count(limit.group) - removed,
    }


def _put_right(tx: Overlay, group: str) -> None:
    """The slots of ``group`` are those of its tasks acquired now, and of its pending
    tasks whose ``execute`` was let through: a slot of a task that ended is freed,
    an acquired task without one gets one."""
    tx.backend.flow_lock(group)
    for task_id in tx.backend.flow_slots_of(group):
        task = tx.get_task(task_id)
        if task is None or task.state not in (ACQUIRED, TASK_PENDING):
            tx.take_slot(task_id, None)
    after: str | None = None
    while True:
        page = tx.scan_tasks([ACQUIRED], after, SCAN_PAGE)
        for task in page:
            promise = tx.get_promise(task.id)
            if promise is None or group_of(promise.tags.get(TAG_TARGET, "")) != group:
                continue
            if tx.flow_slot(task.id) is None:
                tx.take_slot(task.id, group, key_of(promise.tags))
        if len(page) < SCAN_PAGE:
            return
        after = page[-1].id
