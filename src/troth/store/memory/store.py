"""Group commit over the memory backend's dicts, under the store's one lock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from troth.flow.limits import Limit
from troth.store.base import Backend, Store
from troth.store.inspection import Inspection
from troth.store.memory.backend import MemoryBackend
from troth.store.memory.inspection import MemoryInspection
from troth.store.memory.outbox import MemoryOutboxTable
from troth.store.memory.retention import MemoryRetention
from troth.store.outbox import OutboxStore, OutboxTable
from troth.store.retention import Retention

T = TypeVar("T")


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
