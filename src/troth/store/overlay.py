"""A job's view of the store: its own writes over the backend's rows (read your
writes), and the read-only view a read job gets.  The machine's ``Tx``."""

from __future__ import annotations

from collections.abc import Collection

from troth.flow.limits import Held, held_order, key_of
from troth.protocol.records import (
    EARLIEST,
    TAG_BRANCH,
    Message,
    OutboxEntry,
    Promise,
    Schedule,
    Tags,
    Task,
    message_key,
)
from troth.store.backend import Backend
from troth.store.writes import Writes


class Overlay:
    """A job's private view: its own writes over the shared transaction.

    Implements the machine's ``Tx``.  Searches and the deadline index read the backend
    only (they see earlier jobs of the batch, not this job's own writes); no handler
    searches after writing something the search could return.  ``preload`` merges the
    job's own writes into the branch it reads.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.writes = Writes()
        #: Promises this job read from the backend, by id: a handler and the steps
        #: after it (flow control's gate) read the same one more than once, and the
        #: backend's rows do not change while the job runs.
        self.read: dict[str, Promise | None] = {}
        #: The same for tasks.
        self.read_tasks: dict[str, Task | None] = {}

    def get_promise(self, id: str) -> Promise | None:
        p = self.writes.promises.get(id)
        if p is not None:
            return p
        read = self.read
        if id in read:
            return read[id]
        p = read[id] = self.backend.get_promise(id)
        return p

    def get_task(self, id: str) -> Task | None:
        t = self.writes.tasks.get(id)
        return t if t is not None else self.stored_task(id)

    def stored_task(self, id: str) -> Task | None:
        """The task as the backend holds it, before this job's writes."""
        read = self.read_tasks
        if id in read:
            return read[id]
        t = read[id] = self.backend.get_task(id)
        return t

    def get_schedule(self, id: str) -> Schedule | None:
        if id in self.writes.schedules:
            return self.writes.schedules[id]
        return self.backend.get_schedule(id)

    def set_promise(self, promise: Promise) -> None:
        self.writes.promises[promise.id] = promise

    def set_task(self, task: Task) -> None:
        self.writes.tasks[task.id] = task

    def set_schedule(self, schedule: Schedule) -> None:
        self.writes.schedules[schedule.id] = schedule

    def del_schedule(self, id: str) -> None:
        self.writes.schedules[id] = None

    def set_message(self, address: str, message: Message) -> None:
        key = message_key(address, message)
        self.writes.messages.pop(key, None)  # keep emission order: latest last
        self.writes.messages[key] = OutboxEntry(address, message)

    def hold_message(self, key: str, available_at: int) -> OutboxEntry | None:
        """Let the message this job wrote under ``key`` be claimed only from
        ``available_at`` on; the message, or None if the job wrote none under it.

        Not the machine's (it stays pure and per the specification): the server calls
        it after ``handle`` returned, to back off a task that keeps bouncing."""
        entry = self.written_message(key)
        if entry is not None:
            self.writes.available_at[key] = available_at
        return entry

    def written_message(self, key: str) -> OutboxEntry | None:
        """The message this job wrote under ``key``, if any (the server asks after
        ``handle`` returned; the machine never needs to)."""
        return self.writes.messages.get(key)

    def scan_promises(
        self, states: Collection[str] | None, tags: Tags, after: str | None, limit: int
    ) -> list[Promise]:
        return self.backend.scan_promises(states, tags, after, limit)

    def scan_tasks(
        self, states: Collection[str] | None, after: str | None, limit: int
    ) -> list[Task]:
        return self.backend.scan_tasks(states, after, limit)

    def scan_schedules(self, tags: Tags, after: str | None, limit: int) -> list[Schedule]:
        return self.backend.scan_schedules(tags, after, limit)

    def promises_in_branch(self, branch: str, limit: int) -> list[Promise]:
        """The branch as this job sees it: stored members plus the job's own writes
        (a fenced create answers with a ``preload`` that lists the sibling it made)."""
        found = {p.id: p for p in self.backend.promises_in_branch(branch, limit)}
        for p in self.writes.promises.values():
            if p.tags.get(TAG_BRANCH) == branch:
                found[p.id] = p
        return [found[id] for id in sorted(found)][:limit]

    def due_promises(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        return self.backend.due_promises(now, limit, since)

    def due_tasks(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        return self.backend.due_tasks(now, limit, since)

    def due_schedules(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        return self.backend.due_schedules(now, limit, since)

    def undrained_promises(self, limit: int) -> list[str]:
        return self.backend.undrained_promises(limit)

    def next_deadline(self) -> int | None:
        return self.backend.next_deadline()

    # -- flow control: the backend's rows with this job's own changes over them ------

    def flow_slot(self, task_id: str) -> str | None:
        slots = self.writes.slots
        if slots is not None and task_id in slots:
            return slots[task_id]
        return self.backend.flow_slot(task_id)

    def flow_in_use(self, group: str) -> int:
        n = self.backend.flow_in_use(group)
        for task_id, now_in in (self.writes.slots or {}).items():
            before = self.backend.flow_slot(task_id)
            n += (now_in == group) - (before == group)
        return n

    def flow_held(self, group: str, limit: int, offset: int = 0) -> list[Held]:
        mine = self.writes.held or {}
        stored = self.backend.flow_held(group, offset + limit + len(mine))
        found = [h for h in stored if h.task_id not in mine]
        found += [h for h in mine.values() if h is not None and h.group == group]
        return sorted(found, key=held_order)[offset : offset + limit]

    def flow_key_in_use(self, group: str, key: str) -> int:
        n = self.backend.flow_key_in_use(group, key)
        for task_id, now_in in (self.writes.slots or {}).items():
            if self.key_of_task(task_id) == key:
                before = self.backend.flow_slot(task_id)
                n += (now_in == group) - (before == group)
        return n

    def key_of_task(self, task_id: str) -> str:
        """The ``troth:key`` of the task's promise ("" without one)."""
        promise = self.get_promise(task_id)
        return "" if promise is None else key_of(promise.tags)

    def flow_place(self, task_id: str, group: str, key: str) -> tuple[Held | None, int]:
        """The task's place in the queue, and the last turn a new task of ``key``
        queues behind (``Backend.flow_place``), with this job's own changes."""
        held = self.writes.held or {}
        if task_id in held and held[task_id] is not None:
            return held[task_id], 0
        stored, turn = self.backend.flow_place(task_id, group, key)
        queued = None if task_id in held else stored
        turns = self.writes.turns
        if turns is not None and group in turns:
            turn = max(turn, turns[group])
        for h in held.values():
            if h is not None and h.group == group and h.key == key:
                turn = max(turn, h.turn)
        return queued, turn

    def flow_turn(self, group: str) -> int:
        turns = self.writes.turns
        if turns is not None and group in turns:
            return turns[group]
        return self.backend.flow_turn(group)

    def set_turn(self, group: str, turn: int) -> None:
        """The turn of the last task of ``group`` let through, after this job."""
        if self.writes.turns is None:
            self.writes.turns = {}
        self.writes.turns[group] = turn

    def flow_tat(self, group: str) -> float:
        tats = self.writes.tats
        if tats is not None and group in tats:
            return tats[group]
        return self.backend.flow_tat(group)

    def set_tat(self, group: str, tat: float) -> None:
        """The group's token bucket after this job's starts."""
        if self.writes.tats is None:
            self.writes.tats = {}
        self.writes.tats[group] = tat

    def take_slot(self, task_id: str, group: str | None, key: str = "") -> None:
        """The task holds a slot of ``group`` from now on (None: it frees its slot),
        counted against ``key`` (its ``troth:key``)."""
        if self.writes.slots is None:
            self.writes.slots = {}
        self.writes.slots[task_id] = group
        if key and group is not None:
            if self.writes.slot_keys is None:
                self.writes.slot_keys = {}
            self.writes.slot_keys[task_id] = key

    def queue(self, task_id: str, held: Held | None) -> None:
        """Queue the task for a slot (None: take it out of the queue)."""
        if self.writes.held is None:
            self.writes.held = {}
        self.writes.held[task_id] = held


class ReadOnly(Overlay):
    """The view of a read-only job: the backend's rows, with no writes of its own to
    look through first (nor a :class:`Writes` made for them), and a write refused
    where it is tried (a read that writes is a bug)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def get_promise(self, id: str) -> Promise | None:
        return self.backend.get_promise(id)

    def get_task(self, id: str) -> Task | None:
        return self.backend.get_task(id)

    def get_schedule(self, id: str) -> Schedule | None:
        return self.backend.get_schedule(id)

    def set_promise(self, promise: Promise) -> None:
        raise RuntimeError("a read-only job wrote")

    def set_task(self, task: Task) -> None:
        raise RuntimeError("a read-only job wrote")

    def set_schedule(self, schedule: Schedule) -> None:
        raise RuntimeError("a read-only job wrote")

    def del_schedule(self, id: str) -> None:
        raise RuntimeError("a read-only job wrote")

    def set_message(self, address: str, message: Message) -> None:
        raise RuntimeError("a read-only job wrote")

    def hold_message(self, key: str, available_at: int) -> OutboxEntry | None:
        raise RuntimeError("a read-only job wrote")

    def written_message(self, key: str) -> OutboxEntry | None:
        return None

    def promises_in_branch(self, branch: str, limit: int) -> list[Promise]:
        return self.backend.promises_in_branch(branch, limit)
