"""The retention loop: settled workflows older than ``retention`` are deleted in the
background, a small batch at a time (docs/operations.md, "Retention"; the rules are
store/retention.py's).

Each batch runs on the connection of the one writer (SQLite, memory) or on a session
of its own (PostgreSQL, where it never waits for a request's rows); a pass over
every candidate root ends in a pause of ``retention_interval`` seconds.  On SQLite a
batch rides in the transaction of the request batch that runs next when requests
wait (after their jobs, under a savepoint: ``Engine.exclusive``'s ``inside``), and
runs alone between batches when none do: riding, it shares their COMMIT, whose WAL
writes, fsync and checkpoints run on the writer thread rather than on the event
loop, where a batch alone commits.

Catching up is background work.  While requests are being served, a batch is sized
to hold the writer about :data:`TARGET` seconds and is followed by a pause long
enough that retention takes at most :data:`SHARE` of the writer's time; when no
request came since the last batch, the next one follows at once, with as many roots
as ``retention_batch`` allows.  So retention uses what the foreground leaves idle,
and under a load that leaves it no room it falls behind rather than slowing every
request: ``troth_retention_behind_seconds`` then grows, and the log says so.

With ``archive_dir`` every tree is first written as one JSON line to a gzip file of
the day; a write that fails stops the deletion (the batch rolls back) and the loop
tries again after the pause.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, TypeVar

from troth.engine import Engine
from troth.plural import counted
from troth.server.metrics import Metrics
from troth.store.retention import START, Retention, Swept, Tree
from troth.waiting import cancel_and_wait

log = logging.getLogger("troth.retention")

T = TypeVar("T")

#: Shortest pause between two batches of one pass while requests are being served.
BETWEEN_BATCHES: Final = 0.01
#: The share of the writer's time retention may take while requests are being served.
SHARE: Final = 0.15
#: How long one batch should hold the writer while requests are being served (s).
TARGET: Final = 0.002
#: Roots of the first batch (pages of a first step of giving back: eight times as many).
FIRST: Final = 8
#: The share of the file's pages a pass leaves free (SQLite): the rows written until
#: the next pass reuse them, rather than grow the file again just after it shrank.
SPARE: Final = 1 / 16
#: Most free pages one step gives back (an idle writer; fewer under load, paced).
RECLAIM_MOST: Final = 2000
#: How far behind (ms) retention may be before the log says so, and how often (s).
BEHIND_WARN: Final = 600_000
BEHIND_EVERY: Final = 300.0


class Archive:
    """Trees as JSON lines in ``{dir}/troth-archive-YYYY-MM-DD.jsonl.gz`` (UTC day of
    deletion), one gzip member appended per batch and fsynced before the deletion
    commits: at least once (a batch re-run after a failed commit writes again)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, now_ms: int) -> Path:
        day = datetime.fromtimestamp(now_ms / 1000, tz=UTC).strftime("%Y-%m-%d")
        return self.dir / f"troth-archive-{day}.jsonl.gz"

    def write(self, trees: Sequence[Tree], now_ms: int) -> None:
        lines = b"".join(
            json.dumps({"deletedAt": now_ms, **t.as_json()}, separators=(",", ":")).encode() + b"\n"
            for t in trees
        )
        with open(self.path(now_ms), "ab") as f:
            f.write(gzip.compress(lines))
            f.flush()
            os.fsync(f.fileno())


class RetentionLoop:
    """Deletes settled workflows older than ``horizon_ms``, ``batch`` roots at a time."""

    def __init__(
        self,
        engine: Engine,
        horizon_ms: int,
        *,
        batch: int,
        interval: float,
        metrics: Metrics,
        archive: Archive | None = None,
        on_batch: Callable[[Swept, float], None] | None = None,
    ) -> None:
        self.engine = engine
        self.horizon_ms = horizon_ms
        self.batch = batch
        self.interval = interval
        self.metrics = metrics
        self.archive = archive
        self.cursor = START
        self.behind_ms = 0
        self.last_run = 0.0
        #: Roots the next batch looks at (up to ``batch``; fewer under load).  The first
        #: batch is small: a server restarted under load with a backlog would otherwise
        #: hold the writer for a whole ``retention_batch`` of cold rows at once
        #: (measured: 50 ms for 100); an idle writer's next batch is full anyway.
        self.roots = min(batch, FIRST)
        #: Free pages the next step of giving back takes (up to :data:`RECLAIM_MOST`).
        self.pages = FIRST * 8
        #: Seconds the last batch (or step of giving back) held the writer (or its session).
        self.held = 0.0
        self._jobs = 0
        # Never warned: -inf, not 0, as time.monotonic() may be a just-booted uptime.
        self._warned = -math.inf
        self._task: asyncio.Task[None] | None = None
        #: Told of each batch and how long it took (tracing).
        self.on_batch = on_batch
        metrics.gauge("troth_retention_behind_seconds", lambda: self.behind_ms / 1000)
        metrics.gauge("troth_retention_last_run_timestamp_seconds", lambda: self.last_run)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="troth-retention")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def run_once(self) -> Swept:
        """One batch from the cursor (the loop's unit of work; tests call it)."""
        began = time.perf_counter()
        now = self.engine.clock()
        cutoff = now - self.horizon_ms
        cursor = self.cursor
        store = self.engine.store

        def archive(trees: Sequence[Tree]) -> None:
            if self.archive is not None:
                self.archive.write(trees, now)

        roots = self.roots

        def sweep(r: Retention) -> Swept:
            return r.sweep(cutoff, cursor, roots, archive)

        def batch() -> Swept:
            return self._timed(lambda: store.retain(sweep))

        def inside() -> Swept:
            return self._timed(lambda: store.retain_open(sweep))

        if store.shared:
            swept = await asyncio.to_thread(batch)  # its own session, skip-locked
        else:  # between request batches, or in one; on the event loop where they run
            swept = await self.engine.exclusive(batch, here=True, inside=inside)
        self.cursor = swept.cursor if swept.cursor is not None else START
        self.behind_ms = swept.behind_ms if swept.trees else 0
        self.last_run = time.time()
        m = self.metrics
        m.inc("troth_retention_trees_deleted_total", swept.trees)
        for table, n in (("promises", swept.promises), ("tasks", swept.tasks)):
            m.inc("troth_retention_rows_deleted_total", n, table=table)
        m.inc("troth_retention_rows_deleted_total", swept.outbox, table="outbox")
        if swept.trees:
            trees, promises = counted(swept.trees, "workflow"), counted(swept.promises, "promise")
            log.debug("retention deleted %s (%s)", trees, promises)
        if self.on_batch is not None:
            self.on_batch(swept, time.perf_counter() - began)
        return swept

    async def _run(self) -> None:
        while True:
            try:
                swept = await self.run_once()
                if swept.cursor is None:  # the pass is over
                    await self._reclaim()
            except Exception as exc:
                if self.engine.fault(exc):  # full, read-only, away: logged once an episode
                    log.debug("retention batch: %s; trying again in %.0f s", exc, self.interval)
                else:
                    log.exception("retention batch failed; trying again in %.0f s", self.interval)
                self.cursor = START
                await asyncio.sleep(self.interval)
                continue
            if swept.cursor is None:
                await asyncio.sleep(self.interval)
            else:
                await asyncio.sleep(self.pace())

    def pace(self) -> float:
        """After a batch: how long to wait before the next, and its size.  Busy (a
        request ran since the last batch): the batch is sized toward :data:`TARGET`
        and the pause keeps retention within :data:`SHARE` of the writer.  Idle: at
        once, and as big as ``retention_batch``."""
        self.roots, pause = self._paced(self.roots, self.batch)
        if (
            pause
            and self.behind_ms > BEHIND_WARN
            and time.monotonic() - self._warned > BEHIND_EVERY
        ):
            self._warned = time.monotonic()
            log.warning(
                "retention is %.0f s behind its horizon: requests keep the writer busy and it"
                " takes at most %d%% of it while they do (docs/operations.md, 'Retention')",
                self.behind_ms / 1000,
                SHARE * 100,
            )
        return pause

    def _paced(self, size: int, most: int) -> tuple[int, float]:
        """The size of the next step (roots, or pages to give back) and the pause before
        it, after a step that held the writer :attr:`held` seconds (:meth:`pace`)."""
        jobs = self.engine.stats.jobs
        busy, self._jobs = jobs != self._jobs, jobs
        if not busy:
            return most, 0.0
        held = max(self.held, 1e-4)
        if held > TARGET:
            size = max(1, int(size * TARGET / held))
        elif held < TARGET / 2:
            size = min(most, size * 2)
        return size, max(BETWEEN_BATCHES, held * (1 - SHARE) / SHARE)

    def _timed(self, fn: Callable[[], T]) -> T:
        """``fn()``, and how long it held the writer in :attr:`held`."""
        began = time.perf_counter()
        try:
            return fn()
        finally:
            self.held = time.perf_counter() - began

    async def _reclaim(self) -> None:
        """The pass is over: give back the free pages beyond :data:`SPARE` of the file
        (a SQLite file made with incremental auto-vacuum; other stores have none to
        give), a step at a time, paced as batches are and riding in request batches
        as they do.  In one go, the pages a long backlog freed held the writer for
        long (2,000 pages: 150 ms on the 2-CPU machine of docs/benchmarks.md), and
        under a steady load the spare pages are what the next rows fill."""
        store = self.engine.store
        while True:
            alone = functools.partial(
                self._timed, functools.partial(store.reclaim, self.pages, SPARE)
            )
            inside = functools.partial(
                self._timed, functools.partial(store.reclaim_open, self.pages, SPARE)
            )
            left = await self.engine.exclusive(alone, here=True, inside=inside)
            if left <= 0:
                break
            self.pages, pause = self._paced(self.pages, RECLAIM_MOST)
            await asyncio.sleep(pause)
        self.metrics.inc("troth_retention_passes_total")
        log.debug("retention pass done")
