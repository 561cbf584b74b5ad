"""The in-memory backend: dicts and deadline heaps, for tests and ``troth dev``.

Nothing survives the process.  Deadline heaps are lazy: an entry is valid only while
the object still carries that deadline, so re-arming just pushes a new entry and
stale ones are dropped when they reach the top.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Callable, Collection, Sequence
from typing import Any

import msgspec

from troth.protocol.records import PENDING, Promise, Schedule, Tags, Task
from troth.store import rows
from troth.store.base import Backend, Store, Writes
from troth.store.rows import OutboxRow


def promise_deadline(p: Promise) -> int | None:
    return p.timeout_at if p.state == PENDING and p.external else None


def task_deadline(t: Task) -> int | None:
    if t.state == "pending":
        return t.retry_at
    if t.state == "acquired":
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


class MemoryBackend(Backend):
    def __init__(self) -> None:
        self.promises: dict[str, Promise] = {}
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

    # -- reads ------------------------------------------------------------------

    def get_promise(self, id: str) -> Promise | None:
        return self.promises.get(id)

    def get_task(self, id: str) -> Task | None:
        return self.tasks.get(id)

    def get_schedule(self, id: str) -> Schedule | None:
        return self.schedules.get(id)

    def scan_promises(
        self, states: Collection[str] | None, tags: Tags, after: str | None, limit: int
    ) -> list[Promise]:
        out: list[Promise] = []
        for id in sorted(self.promises):
            if after is not None and id <= after:
                continue
            p = self.promises[id]
            if states is not None and p.state not in states:
                continue
            if any(p.tags.get(k) != v for k, v in tags.items()):
                continue
            out.append(p)
            if len(out) == limit:
                break
        return out

    def scan_tasks(
        self, states: Collection[str] | None, after: str | None, limit: int
    ) -> list[Task]:
        out: list[Task] = []
        for id in sorted(self.tasks):
            if after is not None and id <= after:
                continue
            t = self.tasks[id]
            if states is None or t.state in states:
                out.append(t)
                if len(out) == limit:
                    break
        return out

    def scan_schedules(self, tags: Tags, after: str | None, limit: int) -> list[Schedule]:
        out: list[Schedule] = []
        for id in sorted(self.schedules):
            if after is not None and id <= after:
                continue
            s = self.schedules[id]
            if all(s.promise_tags.get(k) == v for k, v in tags.items()):
                out.append(s)
                if len(out) == limit:
                    break
        return out

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
                branch = p.tags.get("resonate:branch")
                if branch:
                    self.branches.setdefault(branch, set()).add(p.id)
            d = promise_deadline(p)
            if d is not None and (old is None or promise_deadline(old) != d):
                heapq.heappush(self.p_heap, (d, p.id))
            if p.state != PENDING and (p.callbacks or p.listeners):
                self.undrained.add(p.id)
            else:
                self.undrained.discard(p.id)
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
        for key, entry in writes.messages.items():
            old_id = self.pending_by_key.pop(key, None)
            if old_id is not None:
                self.outbox.pop(old_id, None)
            row = OutboxRow(
                id=next(self.seq), entry=entry, created_at=now, available_at=now, updated_at=now
            )
            self.outbox[row.id] = row
            self.pending_by_key[key] = row.id

    def snapshot(self) -> dict[str, Any]:
        return {
            "promises": [snap_promise(self.promises[i]) for i in sorted(self.promises)],
            "tasks": [snap_task(self.tasks[i]) for i in sorted(self.tasks)],
            "schedules": [msgspec.to_builtins(self.schedules[i]) for i in sorted(self.schedules)],
            "outbox": [snap_row(r) for r in sorted(self.outbox.values(), key=lambda r: r.id)],
        }


def snap_promise(p: Promise) -> dict[str, Any]:
    d: dict[str, Any] = msgspec.to_builtins(p)
    d["callbacks"] = list(p.callbacks)
    d["listeners"] = list(p.listeners)
    return d


def snap_task(t: Task) -> dict[str, Any]:
    d: dict[str, Any] = msgspec.to_builtins(t)
    d["resumes"] = list(t.resumes)
    return d


def snap_row(r: OutboxRow) -> dict[str, Any]:
    return {
        "id": r.id,
        "key": r.entry.key,
        "address": r.entry.address,
        "message": msgspec.to_builtins(r.entry.message),
        "state": r.state,
        "attempts": r.attempts,
        "availableAt": r.available_at,
        "createdAt": r.created_at,
        **({"lastCode": r.last_code} if r.last_code is not None else {}),
    }


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

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return self.backend.snapshot()

    def ping(self) -> None:
        return None


class MemoryOutbox:
    """The outbox-row lifecycle over :class:`MemoryBackend` (see ``store.rows``)."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    @property
    def b(self) -> MemoryBackend:
        return self.store.backend

    def claim_due(self, worker_id: str, now: int, limit: int, token: str) -> list[OutboxRow]:
        with self.store.lock:
            out: list[OutboxRow] = []
            for row in sorted(self.b.outbox.values(), key=lambda r: (r.available_at, r.id)):
                if len(out) == limit or row.available_at > now:
                    break
                if row.state != rows.PENDING:
                    continue
                row.state = rows.DISPATCHING
                row.claim_token = token
                row.claimed_by = worker_id
                row.claimed_at = now
                row.updated_at = now
                self.b.pending_by_key.pop(row.key, None)
                out.append(dataclasses.replace(row))
            return out

    def _held(self, row_id: int, token: str) -> OutboxRow | None:
        row = self.b.outbox.get(row_id)
        if row is None or row.state != rows.DISPATCHING or row.claim_token != token:
            return None
        return row

    def _finish(self, row: OutboxRow, state: str, now: int, code: str | None) -> None:
        row.state = state
        row.claim_token = None
        row.last_code = code
        row.updated_at = now

    def _requeue(self, row: OutboxRow, now: int, available_at: int, code: str | None) -> None:
        """Back to pending, unless a newer pending row for the key supersedes it."""
        if row.key in self.b.pending_by_key:
            self._finish(row, rows.COMPLETED, now, rows.SUPERSEDED)
            return
        self._finish(row, rows.PENDING, now, code)
        row.available_at = available_at
        self.b.pending_by_key[row.key] = row.id

    def settle_many(self, items: Sequence[rows.Settlement]) -> list[bool]:
        with self.store.lock:
            return [self._settle(*item) for item in items]

    def _settle(
        self,
        row_id: int,
        token: str,
        state: str,
        now: int,
        code: str | None,
        available_at: int | None,
    ) -> bool:
        row = self._held(row_id, token)
        if row is None:
            return False
        if state == rows.PENDING:
            row.attempts += 1
            self._requeue(row, now, available_at if available_at is not None else now, code)
        else:
            if state == rows.FAILED:
                row.attempts += 1
            self._finish(row, state, now, code)
        return True

    def unknown_rows(self, limit: int) -> list[OutboxRow]:
        with self.store.lock:
            found = [r for r in self.b.outbox.values() if r.state == rows.OUTCOME_UNKNOWN]
            return [dataclasses.replace(r) for r in sorted(found, key=lambda r: r.id)[:limit]]

    def settle_unknown(self, row_id: int, now: int, state: str, code: str | None) -> bool:
        with self.store.lock:
            row = self.b.outbox.get(row_id)
            if row is None or row.state != rows.OUTCOME_UNKNOWN:
                return False
            if state == rows.PENDING:
                self._requeue(row, now, now, code)
            else:
                self._finish(row, state, now, code)
            return True

    def release_expired_claims(self, cutoff: int, now: int, code: str) -> int:
        with self.store.lock:
            n = 0
            for row in self.b.outbox.values():
                if row.state == rows.DISPATCHING and (row.claimed_at or 0) < cutoff:
                    self._finish(row, rows.OUTCOME_UNKNOWN, now, code)
                    n += 1
            return n

    def purge_completed(self, before: int) -> int:
        with self.store.lock:
            old = [
                r.id
                for r in self.b.outbox.values()
                if r.state == rows.COMPLETED and r.updated_at < before
            ]
            for i in old:
                del self.b.outbox[i]
            return len(old)

    def next_due(self) -> int | None:
        with self.store.lock:
            due = [r.available_at for r in self.b.outbox.values() if r.state == rows.PENDING]
            return min(due) if due else None
