"""The in-memory store: dicts and deadline heaps, for tests and ``troth dev``.

Nothing survives the process.  ``backend`` (the dicts, their heaps, one job's
writes applied), ``store`` (group commit over them, under one lock), ``outbox`` (the
outbox dict as the lifecycle's table), ``inspection`` and ``retention`` (the
operator's reads and the deletion of settled trees, as scans of the dicts).
"""

from troth.store.memory.backend import MemoryBackend
from troth.store.memory.store import MemoryOutbox, MemoryStore

__all__ = ["MemoryBackend", "MemoryOutbox", "MemoryStore"]
