"""The built-in reconciler: what the server knows settles an unknown row.

An ``execute`` is done once its task left ``pending`` at that version, and is re-sent
while the task is still pending at that version (a duplicate is fenced by the
version).  An ``unblock`` is re-sent a bounded number of times.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from troth.engine import Engine
from troth.machine.internal import Config
from troth.outbox import codes
from troth.outbox.rows import OutboxRow
from troth.outbox.types import Completed, Failed, Reconciled, Resend
from troth.protocol.records import Execute, OutboxEntry, PromiseRecord, Unblock, Value
from troth.protocol.requests import decode_data
from troth.server.delivery.loop import ProtocolReconciler
from troth.store.memory import MemoryStore

NOW = 10_000


def verdicts(setup: list[tuple[str, dict[str, Any]]], rows: list[OutboxRow]) -> list[Reconciled]:
    async def main() -> list[Reconciled]:
        engine = Engine(MemoryStore(), Config(), clock=lambda: NOW)
        await engine.start()
        try:
            for kind, data in setup:
                req = decode_data(kind, msgspec.json.encode(data))
                response = await engine.request(req, NOW, {})
                assert response.status == 200, response
            reconciler = ProtocolReconciler(engine, unblock_resends=2)
            return [await reconciler.reconcile(r) for r in rows]
        finally:
            await engine.stop()

    return asyncio.run(main())


def execute_row(task: str, version: int) -> OutboxRow:
    entry = OutboxEntry("poll://any@g", Execute(task_id=task, version=version))
    return OutboxRow(id=1, entry=entry, created_at=0, state="outcome_unknown")


TARGETED = {"resonate:target": "poll://any@g"}


def test_execute_is_resent_while_the_task_is_pending_at_that_version() -> None:
    setup = [("promise.create", {"id": "t", "timeoutAt": 10**9, "tags": TARGETED})]
    assert verdicts(setup, [execute_row("t", 0)]) == [Resend()]


def test_execute_is_done_once_the_task_moved_on() -> None:
    setup = [
        ("promise.create", {"id": "acq", "timeoutAt": 10**9, "tags": TARGETED}),
        ("task.acquire", {"id": "acq", "version": 0, "pid": "w", "ttl": 10**6}),
        ("promise.create", {"id": "done", "timeoutAt": 10**9, "tags": TARGETED}),
        ("promise.settle", {"id": "done", "state": "resolved"}),
        ("promise.create", {"id": "again", "timeoutAt": 10**9, "tags": TARGETED}),
        ("task.acquire", {"id": "again", "version": 0, "pid": "w", "ttl": 10**6}),
        ("task.release", {"id": "again", "version": 1}),
    ]
    rows = [
        execute_row("acq", 0),  # acquired at a newer version
        execute_row("done", 0),  # fulfilled
        execute_row("gone", 0),  # no such task
        execute_row("again", 0),  # pending again, but at version 1: the old one is stale
    ]
    assert verdicts(setup, rows) == [Completed(), Completed(), Completed(), Completed()]


def test_unblock_is_resent_a_bounded_number_of_times() -> None:
    record = PromiseRecord(
        id="p",
        state="resolved",
        param=Value(),
        value=Value(),
        tags={},
        timeout_at=5,
        created_at=1,
        settled_at=2,
    )
    entry = OutboxEntry("poll://uni@g/w", Unblock(record))
    fresh = OutboxRow(id=1, entry=entry, created_at=0, state="outcome_unknown", attempts=1)
    spent = OutboxRow(id=2, entry=entry, created_at=0, state="outcome_unknown", attempts=2)
    assert verdicts([], [fresh, spent]) == [Resend(), Failed(codes.RESENDS_EXHAUSTED)]
