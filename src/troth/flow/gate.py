"""How a job keeps to the limits: run after the machine, in the job's transaction.

The machine stays the specification's (ARCHITECTURE rule 1): it writes an ``execute``
whenever a task becomes due, and lets any worker acquire any pending task.  This
step then looks at what the job wrote, while some group has a limit:

* a task that became acquired takes a slot of its group; a ``task.acquire`` of a
  task that holds none, while the group has no slot free (or tasks queued ahead of
  it), is refused with 409 and the job's writes are dropped (it changes nothing);
* a task that leaves ``acquired`` (fulfil, suspend, halt, release, an expired lease),
  or a pending task settled some other way, frees its slot;
* an ``execute`` to a limited group is taken out of the outbox and its task queued,
  unless the task already holds a slot (the retry timer re-sending to a task that
  no worker has acquired yet);
* then every group whose slots or queue changed admits queued tasks while it has
  slots free: their ``execute`` is written now, in this commit — the next worker
  gets its task at once, not at the next retry timer.

A rate limit counts *starts*: a task let through, or acquired without having been
let through.  Its token bucket is one number per group (``flow.limits.next_start``),
read and written under the same lock as the slots.  When the bucket is empty and
tasks are queued, admission stops and moves the first queued task's ``retryAt`` to
the moment the next token comes: the timer, on whichever node, re-offers that task
then, this step queues its ``execute`` again and admits — no timer of its own, and
nothing lost when the node that stopped dies.

On a store with one writer (memory, SQLite) the counts it reads are exact: no other
job runs beside it.  On PostgreSQL a job locks the group's limit row before it counts
(``Backend.flow_lock``): nodes admitting to one group take turns, and each count
sees the others' committed slots.  Freeing a slot takes no lock: a count that misses
a free only admits less, and the job that freed admits right after, under the lock.
"""

from __future__ import annotations

import math
from typing import Final

from msgspec.structs import replace

from troth.flow.limits import (
    Held,
    Limit,
    group_of,
    key_of,
    next_start,
    priority_of,
    rate_text,
    take_start,
)
from troth.machine.state import ACQUIRED, TASK_PENDING, Response, error
from troth.protocol.records import PENDING, TAG_TARGET, Execute
from troth.store.base import Overlay
from troth.store.writes import Writes

#: Queued tasks one admission reads at a time.
ADMIT_PAGE: Final = 256
#: Queued tasks one admission passes over (their key at its ``per_key``) before it
#: stops looking: what stays held behind them waits for the next admission.
MAX_PASSED: Final = 1024


class Flow:
    """One node's limits (loaded from the store, changed through :meth:`set`) and
    the step each job takes to keep to them."""

    def __init__(self) -> None:
        #: Limits by group; empty: no job pays for flow control.
        self.limits: dict[str, Limit] = {}

    def load(self, limits: list[Limit]) -> None:
        self.limits = {limit.group: limit for limit in limits}

    def keep(self, tx: Overlay, now: int, acquiring: str | None = None) -> Response | None:
        """Bring the job's writes within the limits; a refusal for ``acquiring``
        (the id a ``task.acquire`` names) when it may not take a slot."""
        writes = tx.writes
        if not writes.tasks:
            return None
        limits = self.limits
        touched: set[str] = set()
        for id, task in list(writes.tasks.items()):
            entry = writes.messages.get(id)
            execute = entry if entry is not None and isinstance(entry.message, Execute) else None
            # Only a task of a limited group holds a slot or waits for one: anything
            # else costs this lookup (its promise, which the job has read already).
            group = group_of(execute.address) if execute is not None else self._group(tx, id)
            if group is None or group not in limits:
                continue
            before = tx.stored_task(id)
            was = None if before is None else before.state
            if was == ACQUIRED and task.state == ACQUIRED:
                continue  # a heartbeat, a fence: the slot it holds stays held
            slot = tx.flow_slot(id)
            if task.state == ACQUIRED:
                if slot is not None:
                    continue
                limit = limits[group]
                if id == acquiring:
                    refusal = self._refusal(tx, id, limit, now)
                    if refusal is not None:
                        tx.writes = Writes()
                        return refusal
                if limit.rate is not None:  # a start: from the bucket, in debt if need be
                    tx.backend.flow_lock(group)
                    tx.set_tat(group, take_start(limit, tx.flow_tat(group), now))
                tx.take_slot(id, group, tx.key_of_task(id))
                tx.queue(id, None)
                continue
            if slot is not None:
                if task.state == TASK_PENDING and was == TASK_PENDING:
                    continue  # reserved: its execute (re-)sent, no worker has it yet
                tx.take_slot(id, None)
                touched.add(slot)
            if task.state != TASK_PENDING:
                tx.queue(id, None)  # ended while held (settled, timed out): not waiting
            if execute is not None:
                del writes.messages[id]
                writes.available_at.pop(id, None)
                if writes.withdrawn is None:
                    writes.withdrawn = set()
                writes.withdrawn.add(id)
                tx.queue(id, self._queued(tx, id, group, execute.address))
                touched.add(group)
        for group in touched:
            found = limits.get(group)
            if found is not None:
                admit(tx, now, found)
        return None

    @staticmethod
    def _queued(tx: Overlay, id: str, group: str, address: str) -> Held:
        """The task's place in its group's queue: the one it has (the retry timer
        re-sending to a held task does not move it back), or a new one — its turn
        one past its key's last, and past the last let through."""
        promise = tx.get_promise(id)
        assert promise is not None  # an execute names a task of a promise
        key = key_of(promise.tags)
        queued, last = tx.flow_place(id, group, key)
        if queued is not None and queued.group == group:
            return queued if queued.address == address else replace(queued, address=address)
        return Held(
            id, group, address, priority_of(promise.tags), promise.created_at, key, last + 1
        )

    @staticmethod
    def _group(tx: Overlay, id: str) -> str | None:
        """The worker group the task's promise targets, or None."""
        promise = tx.get_promise(id)
        return None if promise is None else group_of(promise.tags.get(TAG_TARGET, ""))

    @staticmethod
    def _refusal(tx: Overlay, id: str, limit: Limit, now: int) -> Response | None:
        group = limit.group
        tx.backend.flow_lock(group)
        if limit.concurrency is not None:
            in_use = tx.flow_in_use(group)
            if in_use >= limit.concurrency:
                return error(
                    409,
                    f"Task is held by the concurrency limit of group {group}: "
                    f"{in_use} of {limit.concurrency} in use",
                )
        counts = KeyCounts(tx, limit)
        if limit.per_key is not None:
            key = tx.key_of_task(id)
            n = counts.get(key)
            if n >= limit.per_key:
                return error(
                    409,
                    f"Task is held by the per-key limit of group {group}: "
                    f"key {key!r} has {n} of {limit.per_key} in use",
                )
        if limit.rate is not None:
            at = next_start(limit, tx.flow_tat(group), now)
            if at > now:
                return error(
                    409,
                    f"Task is held by the rate limit of group {group}: "
                    f"{rate_text(limit.rate)}, the next start in {math.ceil(at - now)} ms",
                )
        first = next((h for h in tx.flow_held(group, ADMIT_PAGE) if not counts.full(h.key)), None)
        if first is not None and first.task_id != id:
            return error(
                409,
                f"Task is held by the concurrency limit of group {group}: "
                "tasks queued before it go first",
            )
        return None


class KeyCounts:
    """Slots in use by ``troth:key`` in one group, read once per key and counted on
    as a job lets tasks through (only while the limit has ``per_key``)."""

    def __init__(self, tx: Overlay, limit: Limit) -> None:
        self.tx = tx
        self.limit = limit
        self.counts: dict[str, int] = {}

    def get(self, key: str) -> int:
        n = self.counts.get(key)
        if n is None:
            n = self.counts[key] = self.tx.flow_key_in_use(self.limit.group, key)
        return n

    def full(self, key: str) -> bool:
        per_key = self.limit.per_key
        return per_key is not None and self.get(key) >= per_key

    def took(self, key: str) -> None:
        if self.limit.per_key is not None:
            self.counts[key] = self.get(key) + 1


def admit(tx: Overlay, now: int, limit: Limit) -> int:
    """Let queued tasks of the limit's group through, in queue order, while it has
    slots free and tokens in its bucket: each gets its ``execute`` and a slot.  A
    task whose key has all of its ``per_key`` slots is passed over (it keeps its
    place); a queued task that is no longer pending (its promise settled, or a
    worker took it) just leaves the queue.  How many were let through."""
    group = limit.group
    tx.backend.flow_lock(group)
    free = None if limit.concurrency is None else limit.concurrency - tx.flow_in_use(group)
    tat = tx.flow_tat(group) if limit.rate is not None else 0.0
    counts = KeyCounts(tx, limit)
    turn = 0
    admitted = passed = 0
    stopped = False
    while not stopped and (free is None or free > 0) and passed < MAX_PASSED:
        size = ADMIT_PAGE if free is None or limit.per_key is not None else min(free, ADMIT_PAGE)
        # Tasks let through or gone leave the queue (this job's view of it): what
        # is still ahead is what was passed over.
        page = tx.flow_held(group, size, passed)
        if not page:
            break
        for held in page:
            if free is not None and free <= 0:
                break
            task = tx.get_task(held.task_id)
            promise = tx.get_promise(held.task_id)
            if (
                task is None
                or task.state != TASK_PENDING
                or promise is None
                or promise.state != PENDING
                or promise.timeout_at <= now
                or tx.flow_slot(held.task_id) is not None
            ):
                tx.queue(held.task_id, None)
                continue
            if counts.full(held.key):
                passed += 1
                continue
            if limit.rate is not None:
                at = next_start(limit, tat, now)
                if at > now:
                    # No token until ``at``: the timer re-offers this task then.
                    due = math.ceil(at)
                    if task.retry_at is None or task.retry_at > due:
                        tx.set_task(replace(task, retry_at=due))
                    stopped = True
                    break
                tat = take_start(limit, tat, now)
            tx.queue(held.task_id, None)
            tx.set_message(held.address, Execute(task_id=task.id, version=task.version))
            if tx.writes.withdrawn:
                tx.writes.withdrawn.discard(task.id)  # its new row replaces the old
            tx.take_slot(task.id, group, held.key)
            counts.took(held.key)
            turn = max(turn, held.turn)
            if free is not None:
                free -= 1
            admitted += 1
    if admitted:
        if limit.rate is not None:
            tx.set_tat(group, tat)
        if turn > tx.flow_turn(group):
            tx.set_turn(group, turn)
    return admitted
