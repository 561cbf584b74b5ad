"""The operator's read-only views (``store/inspection.py``) over the memory store's dicts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

from troth.flow.limits import Held, held_order
from troth.outbox.rows import OutboxRow
from troth.protocol.records import TAG_ORIGIN, Promise, Schedule, Tags, Task
from troth.store.inspection import TREE_LIMIT, Counts, Inspection, LimitUse
from troth.store.memory.backend import MemoryBackend, scan


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

        return [(p.id, p.state, p.tags) for p in scan(self.b.promises, match, after, size)]

    def tree(self, origin: str, limit: int = TREE_LIMIT) -> list[Promise]:
        return scan(self.b.promises, lambda p: p.tags.get(TAG_ORIGIN) == origin, None, limit)

    def promises(
        self, prefix: str, state: str | None, after: str | None, limit: int
    ) -> list[Promise]:
        def match(p: Promise) -> bool:
            return p.id.startswith(prefix) and (state is None or p.state == state)

        return scan(self.b.promises, match, after, limit)

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
