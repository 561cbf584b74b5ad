"""The in-memory backend: dicts and deadline heaps, for tests and ``troth dev``.

Nothing survives the process.  Deadline heaps are lazy: an entry is valid only while
the object still carries that deadline, so re-arming just pushes a new entry and
stale ones are dropped when they reach the top.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, TypeVar

from troth.flow.limits import Held, Limit, held_order
from troth.outbox import codes
from troth.outbox.rows import OutboxRow, RowState
from troth.protocol.records import (
    PENDING,
    TAG_BRANCH,
    TAG_ORIGIN,
    Execute,
    Promise,
    Schedule,
    Tags,
    Task,
)
from troth.store.base import Backend, Store
from troth.store.deadlines import promise_deadline, task_deadline
from troth.store.inspection import TREE_LIMIT, Counts, Inspection, LimitUse
from troth.store.outbox import OutboxStore, OutboxTable
from troth.store.retention import Retention, Tree, settled_at
from troth.store.snapshot import snapshot
from troth.store.writes import Writes

T = TypeVar("T")


V = TypeVar("V")


def _scan(rows: dict[str, V], match: Callable[[V], bool], after: str | None, limit: int) -> list[V]:
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

        return _scan(self.promises, match, after, limit)

    def scan_tasks(
        self, states: Collection[str] | None, after: str | None, limit: int
    ) -> list[Task]:
        return _scan(self.tasks, lambda t: states is None or t.state in states, after, limit)

    def scan_schedules(self, tags: Tags, after: str | None, limit: int) -> list[Schedule]:
        def match(s: Schedule) -> bool:
            return all(s.promise_tags.get(k) == v for k, v in tags.items())

        return _scan(self.schedules, match, after, limit)

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

    def due_promises(self, now: int, limit: int) -> list[str]:
        return self._due(self.p_heap, self._valid_p, now, limit)

    def due_tasks(self, now: int, limit: int) -> list[str]:
        return self._due(self.t_heap, self._valid_t, now, limit)

    def due_schedules(self, now: int, limit: int) -> list[str]:
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


class MemoryStore(Store):
    """Group commit over dicts: a batch's writes are applied as each job returns."""

    name = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.backend = MemoryBackend()
        self.outbox = MemoryOutbox(self)

    def begin(self) -> Backend:
        return self.backend

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass

    def savepoint(self) -> None:
        pass

    def release(self) -> None:
        pass

    def rollback_to(self) -> None:
        pass

    def reset(self) -> None:
        with self.lock:
            self.backend = MemoryBackend()

    def flow_load(self) -> list[Limit]:
        with self.lock:
            return self.backend.flow_limits()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return self.backend.snapshot()

    def ping(self) -> None:
        return None

    def inspect(self, fn: Callable[[Inspection], T]) -> T:
        with self.lock:
            return fn(MemoryInspection(self.backend))

    def retain(self, fn: Callable[[Retention], T]) -> T:
        """Under the lock; an archive that raises leaves the dicts as they were (the
        deletions come after it)."""
        with self.lock:
            return fn(MemoryRetention(self.backend))


class MemoryOutbox(OutboxStore):
    """The outbox-row lifecycle (``store/outbox.py``) over :class:`MemoryBackend`."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def write(self, fn: Callable[[OutboxTable], T]) -> T:
        with self.store.lock:
            return fn(MemoryOutboxTable(self.store.backend))


class MemoryOutboxTable(OutboxTable):
    """The outbox dict; ``pending_by_key`` is SQL's partial unique index on pending keys."""

    def __init__(self, b: MemoryBackend) -> None:
        self.b = b

    def claim(self, worker_id: str, now: int, limit: int, token: str) -> list[OutboxRow]:
        out: list[OutboxRow] = []
        # The pending rows are those ``pending_by_key`` names (SQL's partial index):
        # delivered rows, kept an hour, are not walked at every claim.
        outbox = self.b.outbox
        due = [
            row
            for row in (outbox[i] for i in self.b.pending_by_key.values())
            if row.available_at <= now
        ]
        due.sort(key=lambda r: (r.available_at, r.id))
        for row in due:
            if len(out) == limit:
                break
            row.state = RowState.DISPATCHING
            row.claim_token = token
            row.claimed_by = worker_id
            row.claimed_at = now
            row.updated_at = now
            self.b.pending_by_key.pop(row.key, None)
            out.append(dataclasses.replace(row))
        return out

    def find(self, row_id: int, state: RowState, token: str | None) -> tuple[str, int] | None:
        row = self.b.outbox.get(row_id)
        if row is None or row.state != state or row.claim_token != token:
            return None
        return row.key, row.attempts

    def has_pending(self, key: str) -> bool:
        return key in self.b.pending_by_key

    def finish(
        self, row_id: int, state: RowState, attempts: int, code: str | None, now: int
    ) -> None:
        row = self.b.outbox[row_id]
        row.state = state
        row.attempts = attempts
        row.claim_token = None
        row.last_code = code
        row.updated_at = now

    def requeue(
        self, row_id: int, attempts: int, code: str | None, now: int, available_at: int
    ) -> None:
        self.finish(row_id, RowState.PENDING, attempts, code, now)
        row = self.b.outbox[row_id]
        row.available_at = available_at
        self.b.pending_by_key[row.key] = row_id

    def unknown_rows(self, limit: int) -> list[OutboxRow]:
        found = [r for r in self.b.outbox.values() if r.state == RowState.OUTCOME_UNKNOWN]
        return [dataclasses.replace(r) for r in sorted(found, key=lambda r: r.id)[:limit]]

    def release_expired(self, cutoff: int, now: int, code: str, since: int | None = None) -> int:
        n = 0
        for row in self.b.outbox.values():
            claimed = row.claimed_at
            if (
                row.state == RowState.DISPATCHING
                and claimed is not None
                and claimed < cutoff
                and (since is None or claimed >= since)
            ):
                self.finish(row.id, RowState.OUTCOME_UNKNOWN, row.attempts, code, now)
                n += 1
        return n

    def purge_completed(self, before: int) -> int:
        old = [
            r.id
            for r in self.b.outbox.values()
            if r.state == RowState.COMPLETED and r.updated_at < before and r.available_at < before
        ]
        for i in old:
            del self.b.outbox[i]
        return len(old)

    def next_due(self) -> int | None:
        outbox = self.b.outbox
        return min((outbox[i].available_at for i in self.b.pending_by_key.values()), default=None)

    def stranded(self, now: int, since: int) -> list[tuple[int, str, str, str, int]]:
        newest: dict[str, int] = {}  # by task id: an execute's key
        for r in self.b.outbox.values():
            if isinstance(r.entry.message, Execute):
                newest[r.key] = max(newest.get(r.key, r.id), r.id)
        return [
            (r.id, r.key, str(r.state), r.entry.address, r.created_at)
            for r in self.b.outbox.values()
            if (
                r.state == RowState.PENDING
                and r.available_at > now
                and r.last_code == codes.NO_CONNECTION
            )
            or (
                r.state == RowState.FAILED
                and r.available_at >= since
                and r.last_code == codes.ATTEMPTS_EXHAUSTED
                and newest.get(r.key, r.id) == r.id
            )
        ]

    def newer_execute(self, task_id: str, row_id: int) -> bool:
        return any(
            r.id > row_id and isinstance(r.message, Execute) and r.message.task_id == task_id
            for r in self.b.outbox.values()
        )

    def expedite(self, key: str) -> int:
        row_id = self.b.pending_by_key.get(key)
        row = None if row_id is None else self.b.outbox.get(row_id)
        if row is None or row.available_at <= row.created_at:
            return 0
        row.available_at = row.created_at
        return 1


class MemoryInspection(Inspection):
    """Inspection of the dicts (under the store's lock: there is no other reader)."""

    def __init__(self, b: MemoryBackend) -> None:
        self.b = b

    def promise(self, id: str) -> Promise | None:
        return self.b.promises.get(id)

    def task(self, id: str) -> Task | None:
        return self.b.tasks.get(id)

    def trace(self, id: str) -> str | None:
        return self.b.traces.get(id)

    def schedule(self, id: str) -> Schedule | None:
        return self.b.schedules.get(id)

    def window(
        self, prefix: str, origin: str | None, after: str | None, size: int
    ) -> list[tuple[str, str, Tags]]:
        def match(p: Promise) -> bool:
            if origin is not None:
                return p.tags.get(TAG_ORIGIN) == origin
            return p.id.startswith(prefix)

        return [(p.id, p.state, p.tags) for p in _scan(self.b.promises, match, after, size)]

    def tree(self, origin: str, limit: int = TREE_LIMIT) -> list[Promise]:
        return _scan(self.b.promises, lambda p: p.tags.get(TAG_ORIGIN) == origin, None, limit)

    def promises(
        self, prefix: str, state: str | None, after: str | None, limit: int
    ) -> list[Promise]:
        def match(p: Promise) -> bool:
            return p.id.startswith(prefix) and (state is None or p.state == state)

        return _scan(self.b.promises, match, after, limit)

    def newest(self, prefix: str, limit: int) -> list[Promise]:
        ids = sorted((id for id in self.b.promises if id.startswith(prefix)), reverse=True)
        return [self.b.promises[id] for id in ids[:limit]]

    def _newest(self, keep: Callable[[OutboxRow], bool], limit: int) -> list[OutboxRow]:
        rows = sorted((r for r in self.b.outbox.values() if keep(r)), key=lambda r: -r.id)
        return [dataclasses.replace(r) for r in rows[:limit]]

    def deliveries(self, task_id: str, limit: int) -> list[OutboxRow]:
        return self._newest(lambda r: getattr(r.message, "task_id", None) == task_id, limit)

    def outbox(self, state: str | None, before: int | None, limit: int) -> list[OutboxRow]:
        def keep(r: OutboxRow) -> bool:
            return (state is None or r.state == state) and (before is None or r.id < before)

        return self._newest(keep, limit)

    def limits(self) -> list[LimitUse]:
        b = self.b
        return [
            LimitUse(
                g,
                b.limits[g].concurrency,
                b.in_use[g],
                b.flow_held_count(g),
                b.limits[g].rate,
                b.limits[g].per_key,
            )
            for g in sorted(b.limits)
        ]

    def held(self, ids: Sequence[str]) -> dict[str, Held]:
        queued = self.b.queued
        return {id: queued[id] for id in ids if id in queued}

    def key_in_use(self, group: str, key: str) -> int:
        return self.b.flow_key_in_use(group, key)

    def held_ahead(self, held: Held) -> int:
        place = held_order(held)
        return sum(
            1 for h in self.b.queued.values() if h.group == held.group and held_order(h) < place
        )

    def counts(self) -> Counts:
        def by_state(states: Iterable[str]) -> dict[str, int]:
            out: dict[str, int] = {}
            for s in states:
                out[s] = out.get(s, 0) + 1
            return out

        return {
            "promises": by_state(p.state for p in self.b.promises.values()),
            "tasks": by_state(t.state for t in self.b.tasks.values()),
            "outbox": by_state(str(r.state) for r in self.b.outbox.values()),
            "schedules": {"all": len(self.b.schedules)},
        }


def _is_root(p: Promise) -> bool:
    origin = p.tags.get(TAG_ORIGIN)
    return origin is None or origin == p.id


class MemoryRetention(Retention):
    """Retention over the dicts (a scan: the memory store is for tests and dev)."""

    def __init__(self, b: MemoryBackend) -> None:
        self.b = b

    def candidates(self, cutoff: int, after: tuple[int, str], limit: int) -> list[tuple[int, str]]:
        found = sorted(
            (settled_at(p), p.id)
            for p in self.b.promises.values()
            if p.state != PENDING and _is_root(p) and settled_at(p) < cutoff
        )
        return [c for c in found if c > after][:limit]

    def tree(self, root: str) -> tuple[list[Promise], list[Task]] | None:
        promises = sorted(
            (p for p in self.b.promises.values() if p.id == root or p.tags.get(TAG_ORIGIN) == root),
            key=lambda p: p.id,
        )
        tasks = [self.b.tasks[p.id] for p in promises if p.id in self.b.tasks]
        return promises, tasks

    def delete(self, tree: Tree) -> tuple[int, int, int]:
        b = self.b
        task_ids = {t.id for t in tree.tasks}
        rows = [
            r.id
            for r in b.outbox.values()
            if getattr(r.message, "task_id", None) in task_ids and r.state != RowState.DISPATCHING
        ]
        for row_id in rows:
            row = b.outbox.pop(row_id)
            if b.pending_by_key.get(row.key) == row_id:
                del b.pending_by_key[row.key]
        for id in task_ids:
            b.tasks.pop(id, None)
        for p in tree.promises:
            b.promises.pop(p.id, None)
            b.traces.pop(p.id, None)
            b.undrained.discard(p.id)
            branch = p.tags.get(TAG_BRANCH)
            if branch and branch in b.branches:
                b.branches[branch].discard(p.id)
                if not b.branches[branch]:
                    del b.branches[branch]
        return len(tree.promises), len(task_ids), len(rows)
