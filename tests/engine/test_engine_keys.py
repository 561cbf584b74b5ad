"""Which ids a request's job names up front (``Job.keys``): worked out only for a store
that uses them (PostgreSQL locks and reads them before the batch, so that two nodes'
batches over the same ids queue instead of deadlocking); elsewhere they would be
decoding a suspend's or a create's inner actions a second time, for nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from troth.engine import Engine
from troth.machine.core import lock_keys
from troth.machine.internal import Config
from troth.protocol import requests as rq
from troth.store.base import BatchClaim, Job, Outcome
from troth.store.memory import MemoryStore
from troth.store.postgres import PostgresStore
from troth.store.sqlite import SqliteStore


class KeySpy(MemoryStore):
    """A memory store that records the keys of the jobs it runs."""

    def __init__(self, uses_keys: bool) -> None:
        super().__init__()
        self.uses_keys = uses_keys
        self.seen: list[tuple[str, ...]] = []

    def execute(
        self,
        jobs: Sequence[Job[Any]],
        claim_in_batch: Callable[[], BatchClaim | None] | None = None,
    ) -> list[Outcome[Any]]:
        self.seen += [job.keys for job in jobs]
        return super().execute(jobs, claim_in_batch)


def suspend() -> rq.TaskSuspend:
    register = {"awaited": "child", "awaiter": "parent"}
    action = rq.Action(
        kind="promise.registerCallback", data=msgspec.Raw(json.dumps(register).encode())
    )
    return rq.TaskSuspend(id="parent", version=1, actions=[action])


def keys_of(uses_keys: bool) -> list[tuple[str, ...]]:
    async def run() -> list[tuple[str, ...]]:
        store = KeySpy(uses_keys)
        engine = Engine(store, Config())
        await engine.start()
        try:
            await engine.request(suspend(), 0, {"version": "2026-04-01"})
        finally:
            await engine.stop()
        return store.seen

    return asyncio.run(run())


def test_a_store_that_locks_rows_gets_the_ids_the_request_names() -> None:
    assert PostgresStore.uses_keys
    assert lock_keys(suspend())  # the suspend's own id at least
    assert keys_of(True)[0] == lock_keys(suspend())  # [0]: the request (then the timer's)


def test_other_stores_get_none() -> None:
    assert not SqliteStore.uses_keys and not MemoryStore.uses_keys
    assert keys_of(False)[0] == ()
