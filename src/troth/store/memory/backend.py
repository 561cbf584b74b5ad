"""The in-memory backend: dicts and deadline heaps, for tests and ``troth dev``.

Nothing survives the process.  Deadline heaps are lazy: an entry is valid only while
the object still carries that deadline, so re-arming just pushes a new entry and
stale ones are dropped when they reach the top.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from collections.abc import Callable, Collection
from typing import Any, TypeVar

from troth.flow.limits import Held, Limit, held_order
from troth.outbox.rows import OutboxRow
from troth.protocol.records import EARLIEST, PENDING, TAG_BRANCH, Promise, Schedule, Tags, Task
from troth.store.base import Backend
from troth.store.deadlines import promise_deadline, task_deadline
from troth.store.snapshot import snapshot
from troth.store.writes import Writes

V = TypeVar("V")


def scan(rows: dict[str, V], match: Callable[[V], bool], after: str | None, limit: int) -> list[V]:
    """Up to ``limit`` matching rows in id order, after ``after`` (exclusive)."""
    out: list[V] = []
    for id in sorted(rows):
        if after is not None and id <= after:
            continue
        row = rows[id]
        if match(row):
            out.append(row)
            if len(out) == limit:
                break
    return out


class MemoryBackend(Backend):
    """Every row of the memory store, in dicts and deadline heaps: ``MemoryStore``
    hands out this one object as every transaction (commit and rollback have
    nothing to do)."""

    def __init__(self) -> None:
        self.promises: dict[str, Promise] = {}
        #: Trace contexts by promise id (``Writes.traces``; tracing on).
        self.traces: dict[str, str] = {}
        self.tasks: dict[str, Task] = {}
        self.schedules: dict[str, Schedule] = {}
        self.outbox: dict[int, OutboxRow] = {}
        self.pending_by_key: dict[str, int] = {}
        self.branches: dict[str, set[str]] = {}
        self.undrained: set[str] = set()
        self.p_heap: list[tuple[int, str]] = []
        self.t_heap: list[tuple[int, str]] = []
        self.s_heap: list[tuple[int, str]] = []
        self.seq = itertools.count(1)
        #: Flow control (``troth/flow``): limits by group, slots by task id (and
        #: counted by group), queued tasks by id.
        self.limits: dict[str, Limit] = {}
        self.slots: dict[str, str] = {}
        self.in_use: collections.Counter[str] = collections.Counter()
        self.queued: dict[str, Held] = {}
        self.tats: dict[str, float] = {}
        self.turns: dict[str, int] = {}
        #: The ``troth:key`` of a slot, by task id (where it has one).
        self.slot_keys: dict[str, str] = {}

    # -- reads ------------------------------------------------------------------

    def get_promise(self, id: str) -> Promise | None:
        return self.promises.get(id)

    def get_task(self, id: str) -> Task | None:
        return self.tasks.get(id)

    def get_trace(self, id: str) -> str | None:
        return self.traces.get(id)

    def get_schedule(self, id: str) -> Schedule | None:
        return self.schedules.get(id)

    def flow_limits(self) -> list[Limit]:
        return [self.limits[g] for g in sorted(self.limits)]

    def flow_slot(self, task_id: str) -> str | None:
        return self.slots.get(task_id)

    def flow_tat(self, group: str) -> float:
        return self.tats.get(group, 0.0)

    def flow_in_use(self, group: str) -> int:
        return self.in_use[group]

    def flow_slots_of(self, group: str) -> list[str]:
        return sorted(t for t, g in self.slots.items() if g == group)

    def flow_held(self, group: str, limit: int, offset: int = 0) -> list[Held]:
        mine = [h for h in self.queued.values() if h.group == group]
        return sorted(mine, key=held_order)[offset : offset + limit]

    def flow_queued(self, task_id: str) -> Held | None:
        return self.queued.get(task_id)

    def flow_key_in_use(self, group: str, key: str) -> int:
        return sum(
            1 for t, g in self.slots.items() if g == group and self.slot_keys.get(t, "") == key
        )

    def flow_key_turn(self, group: str, key: str) -> int:
        turns = [h.turn for h in self.queued.values() if h.group == group and h.key == key]
        return max(turns, default=0)

    def flow_turn(self, group: str) -> int:
        return self.turns.get(group, 0)

    def flow_held_count(self, group: str) -> int:
        return sum(1 for h in self.queued.values() if h.group == group)

    def scan_promises(
        self, states: Collection[str] | None, tags: Tags, after: str | None, limit: int
    ) -> list[Promise]:
        def match(p: Promise) -> bool:
            in_state = states is None or p.state in states
            return in_state and all(p.tags.get(k) == v for k, v in tags.items())

        return scan(self.promises, match, after, limit)

    def scan_tasks(
        self, states: Collection[str] | None, after: str | None, limit: int
    ) -> list[Task]:
        return scan(self.tasks, lambda t: states is None or t.state in states, after, limit)

    def scan_schedules(self, tags: Tags, after: str | None, limit: int) -> list[Schedule]:
        def match(s: Schedule) -> bool:
            return all(s.promise_tags.get(k) == v for k, v in tags.items())

        return scan(self.schedules, match, after, limit)

    def promises_in_branch(self, branch: str, limit: int) -> list[Promise]:
        ids = sorted(self.branches.get(branch, ()))[:limit]
        return [self.promises[i] for i in ids]

    # -- deadlines ----------------------------------------------------------------

    def _due(
        self, heap: list[tuple[int, str]], valid: Callable[[int, str], bool], now: int, limit: int
    ) -> list[str]:
        taken: list[tuple[int, str]] = []
        out: list[str] = []
        while heap and heap[0][0] <= now and len(out) < limit:
            entry = heapq.heappop(heap)
            if valid(*entry):
                taken.append(entry)
                if entry[1] not in out:
                    out.append(entry[1])
        for entry in taken:
            heapq.heappush(heap, entry)
        return out

    def _valid_p(self, d: int, id: str) -> bool:
        p = self.promises.get(id)
        return p is not None and promise_deadline(p) == d

    def _valid_t(self, d: int, id: str) -> bool:
        t = self.tasks.get(id)
        return t is not None and task_deadline(t) == d

    def _valid_s(self, d: int, id: str) -> bool:
        s = self.schedules.get(id)
        return s is not None and s.next_run_at == d

    # ``since`` is left unused: a heap pops only what is due, and holds no dead entry.

    def due_promises(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        return self._due(self.p_heap, self._valid_p, now, limit)

    def due_tasks(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        return self._due(self.t_heap, self._valid_t, now, limit)

    def due_schedules(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        return self._due(self.s_heap, self._valid_s, now, limit)

    def undrained_promises(self, limit: int) -> list[str]:
        return sorted(self.undrained)[:limit]

    def next_deadline(self) -> int | None:
        best: int | None = 0 if self.undrained else None
        for heap, valid in (
            (self.p_heap, self._valid_p),
            (self.t_heap, self._valid_t),
            (self.s_heap, self._valid_s),
        ):
            while heap and not valid(*heap[0]):
                heapq.heappop(heap)
            if heap and (best is None or heap[0][0] < best):
                best = heap[0][0]
        return best

    # -- writes ---------------------------------------------------------------------

    def apply(self, writes: Writes, now: int) -> None:
        for p in writes.promises.values():
            old = self.promises.get(p.id)
            self.promises[p.id] = p
            if old is None:
                branch = p.tags.get(TAG_BRANCH)
                if branch:
                    self.branches.setdefault(branch, set()).add(p.id)
            d = promise_deadline(p)
            if d is not None and (old is None or promise_deadline(old) != d):
                heapq.heappush(self.p_heap, (d, p.id))
            if p.state != PENDING and (p.callbacks or p.listeners):
                self.undrained.add(p.id)
            else:
                self.undrained.discard(p.id)
        if writes.traces:
            for id, trace in writes.traces.items():
                self.traces.setdefault(id, trace)
        for t in writes.tasks.values():
            self.tasks[t.id] = t
            d = task_deadline(t)
            if d is not None:
                heapq.heappush(self.t_heap, (d, t.id))
        for id, s in writes.schedules.items():
            if s is None:
                self.schedules.pop(id, None)
            else:
                self.schedules[id] = s
                heapq.heappush(self.s_heap, (s.next_run_at, id))
        held = writes.available_at
        for key, entry in writes.messages.items():
            old_id = self.pending_by_key.pop(key, None)
            if old_id is not None:
                self.outbox.pop(old_id, None)
            due = held.get(key, now) if held else now
            row = OutboxRow(
                id=next(self.seq), entry=entry, created_at=now, available_at=due, updated_at=now
            )
            self.outbox[row.id] = row
            self.pending_by_key[key] = row.id
        if writes.has_flow():
            self._apply_flow(writes)

    def _apply_flow(self, writes: Writes) -> None:
        for key in writes.withdrawn or ():
            old_id = self.pending_by_key.pop(key, None)
            if old_id is not None:
                self.outbox.pop(old_id, None)
        keys = writes.slot_keys or {}
        for task_id, group in (writes.slots or {}).items():
            old = self.slots.pop(task_id, None)
            self.slot_keys.pop(task_id, None)
            if old is not None:
                self.in_use[old] -= 1
            if group is not None:
                self.slots[task_id] = group
                self.in_use[group] += 1
                if task_id in keys:
                    self.slot_keys[task_id] = keys[task_id]
        for task_id, held in (writes.held or {}).items():
            if held is None:
                self.queued.pop(task_id, None)
            else:
                self.queued[task_id] = held
        for group, limit in (writes.limits or {}).items():
            if limit is None:
                self.limits.pop(group, None)
                for task_id in [t for t, g in self.slots.items() if g == group]:
                    del self.slots[task_id]
                    self.slot_keys.pop(task_id, None)
                self.in_use.pop(group, None)
                self.tats.pop(group, None)
                self.turns.pop(group, None)
            else:
                self.limits[group] = limit
        for group, tat in (writes.tats or {}).items():
            if group in self.limits:
                self.tats[group] = tat
        for group, turn in (writes.turns or {}).items():
            if group in self.limits:
                self.turns[group] = turn

    def snapshot(self) -> dict[str, Any]:
        return snapshot(
            (self.promises[i] for i in sorted(self.promises)),
            (self.tasks[i] for i in sorted(self.tasks)),
            (self.schedules[i] for i in sorted(self.schedules)),
            sorted(self.outbox.values(), key=lambda r: r.id),
        )
