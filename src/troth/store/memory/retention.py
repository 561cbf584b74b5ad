"""Retention (``store/retention.py``) over the memory store's dicts."""

from __future__ import annotations

from troth.outbox.rows import RowState
from troth.protocol.records import PENDING, TAG_BRANCH, TAG_ORIGIN, Promise, Task
from troth.store.memory.backend import MemoryBackend
from troth.store.retention import Retention, Tree, settled_at


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
