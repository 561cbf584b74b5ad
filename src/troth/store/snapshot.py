"""``debug.snap``: everything a store holds, in one shape for every backend.

The differential tests compare it across backends and against the reference model,
so each backend builds it from the same records through these functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from troth.outbox.rows import OutboxRow
from troth.protocol.records import Promise, Schedule, Task


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
        "state": str(r.state),
        "attempts": r.attempts,
        "availableAt": r.available_at,
        "createdAt": r.created_at,
        **({"lastCode": r.last_code} if r.last_code is not None else {}),
    }


def snapshot(
    promises: Iterable[Promise],
    tasks: Iterable[Task],
    schedules: Iterable[Schedule],
    rows: Iterable[OutboxRow],
) -> dict[str, Any]:
    """Each list in id order, as the caller passes them."""
    return {
        "promises": [snap_promise(p) for p in promises],
        "tasks": [snap_task(t) for t in tasks],
        "schedules": [msgspec.to_builtins(s) for s in schedules],
        "outbox": [snap_row(r) for r in rows],
    }
