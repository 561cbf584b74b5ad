"""Fill a database with settled promises before the server starts (the scale runs).

A million promises through HTTP would take minutes of the run; written straight into
the store they take far less.  They go through the real machine
(``machine.core.handle`` of a decoded ``promise.create`` and ``promise.settle``, in
one job each) and the real group commit (``Store.execute``, SQLite or PostgreSQL),
so the rows are exactly the ones the server would have written, indexes and derived
columns included.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any, overload

from troth.machine.core import handle
from troth.machine.internal import Config
from troth.protocol import requests as rq
from troth.protocol.records import Value
from troth.store.base import Job, Overlay, Store
from troth.store.sqlite import SqliteStore

#: Jobs per transaction while seeding.
BATCH = 5000
FAR = 2**53


def seed_id(prefix: str, i: int) -> str:
    return f"{prefix}{i:09d}"


class SeedIds(Sequence[str]):
    """The seeded ids as a sequence, without a list of a million strings."""

    def __init__(self, prefix: str, count: int) -> None:
        self.prefix = prefix
        self.size = count

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...

    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        if isinstance(i, slice):
            return [seed_id(self.prefix, k) for k in range(self.size)[i]]
        if not -self.size <= i < self.size:
            raise IndexError(i)
        return seed_id(self.prefix, i % self.size)


def seed(path: Path, count: int, prefix: str) -> float:
    """Write ``count`` resolved promises ``{prefix}{i:09d}``; returns the seconds taken.

    Written with ``synchronous=NORMAL``: the seed is not what is measured, and the
    server reopens the file with the setting under test."""
    with closing(SqliteStore(path, synchronous="normal")) as store:
        return seed_store(store, count, prefix)


def seed_postgres(url: str, count: int, prefix: str) -> float:
    """The same rows into a PostgreSQL database (created or upgraded on open)."""
    from troth.store.postgres import PostgresStore

    with closing(PostgresStore(url)) as store:
        return seed_store(store, count, prefix)


def seed_store(
    store: Store,
    count: int,
    prefix: str,
    *,
    start: int = 0,
    progress: Callable[[int], None] | None = None,
) -> float:
    """Seed through any store's group commit, :data:`BATCH` jobs per transaction."""
    config = Config()
    head: dict[str, Any] = {"version": "2026-04-01"}
    started = time.perf_counter()
    now = time.time_ns() // 1_000_000
    for base in range(start, start + count, BATCH):
        jobs: list[Job[None]] = []
        for i in range(base, min(base + BATCH, start + count)):
            id = seed_id(prefix, i)
            arg = base64.b64encode(b'{"func":"seed","args":[%d],"version":1}' % i).decode()
            create = rq.PromiseCreate(
                id=id,
                timeout_at=FAR,
                param=Value(data=arg),
                tags={"resonate:scope": "global", "resonate:origin": id},
            )
            settle = rq.PromiseSettle(id=id, state="resolved", value=Value(data="dHJ1ZQ=="))
            jobs.append(Job(_job(create, settle, now, config, head), now))
        for outcome in store.execute(jobs):
            outcome.result()
        if progress is not None:
            progress(min(base + BATCH, start + count) - start)
    return time.perf_counter() - started


def _job(
    create: rq.PromiseCreate,
    settle: rq.PromiseSettle,
    now: int,
    config: Config,
    head: dict[str, Any],
) -> Callable[[Overlay], None]:
    def run(tx: Overlay) -> None:
        for req in (create, settle):
            response = handle(tx, req, now, config, head)
            if response.status != 200:
                raise RuntimeError(f"seeding {req}: {response}")

    return run
