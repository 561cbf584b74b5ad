"""PgQueuer while the horizon is held, beside troth in the same run
(``python -m troth_bench.horizon --peer pgqueuer``).

The queue a user might pick instead of troth, measured as :mod:`troth_bench.peers`
measures it (``single``): ``--producers`` producers each enqueue one job per
transaction and keep at most :data:`INFLIGHT` of theirs not yet completed, and one
consumer process runs PgQueuer's own ``QueueManager`` (dequeue batch 10).  It runs on
a throwaway database of its own, with the same windows and the same holder as troth's
run, so that the two tables read side by side.  A window's rate is jobs whose
completion committed in it; its latency runs from the enqueue's send to the
completion's commit (troth's is per request).  At the end every job was completed
once, as ``single`` checks.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

from troth_bench import pg
from troth_bench.client import BenchFailure
from troth_bench.horizon_windows import Load, summary, windows
from troth_bench.peers import PAYLOAD, Worker, _install, _queries, _verify, missing, stop
from troth_bench.pgq_worker import ENTRYPOINT

#: Jobs of one producer not yet completed (as ``peers.single``): the consumer never
#: waits for work, and the backlog stays bounded.
INFLIGHT = 4


class Queue:
    """PgQueuer's producers and its consumer, as :class:`~troth_bench.horizon.Driven`."""

    unit = "jobs"
    hot: tuple[str, ...] = ("pgqueuer", "pgqueuer_log")

    def __init__(self, producers: int) -> None:
        self.title = (
            f"PgQueuer, {producers} producers (1 job per transaction, at most {INFLIGHT}"
            " not yet completed), 1 consumer process (dequeue batch 10); latency: enqueue"
            " sent to completion committed"
        )
        self.load = Load()
        self.app_pid = 0
        self.queries: list[Any] = []
        self.reported: Counter[int] = Counter()
        self.enqueued = 0
        self.pending: dict[int, tuple[float, asyncio.Semaphore]] = {}
        self.early: dict[int, float] = {}  # completions reported before enqueue returned
        self.tasks: list[asyncio.Task[None]] = []
        self.worker: Worker | None = None

    def done(self, ids: list[int], at: float) -> None:
        for id in ids:
            self.reported[id] += 1
            entry = self.pending.pop(id, None)
            if entry is None:
                self.early[id] = at
                continue
            self.load.tasks += 1
            self.load.latencies.append(at - entry[0])
            entry[1].release()

    def start(self, stop: float) -> None:
        assert self.worker is not None
        self.worker.go()
        self.tasks = [asyncio.create_task(self._producer(q, stop)) for q in self.queries]

    async def _producer(self, q: Any, stop: float) -> None:
        slots = asyncio.Semaphore(INFLIGHT)
        while time.monotonic() < stop:
            await slots.acquire()
            started = time.perf_counter()
            ids = await q.enqueue(ENTRYPOINT, PAYLOAD)
            self.enqueued += 1
            id = int(ids[0])
            at = self.early.pop(id, None)
            if at is None:
                self.pending[id] = (started, slots)
            else:
                self.load.tasks += 1
                self.load.latencies.append(at - started)
                slots.release()

    async def finish(self) -> None:
        """The producers stop at the end by themselves (a cancelled enqueue would leave
        a job nobody counted); then the consumer drains what is left."""
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=30)
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        deadline = time.monotonic() + 60
        while self.pending and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


async def pgqueuer(args: argparse.Namespace, workdir: Path) -> str | None:
    """PgQueuer's run (see the module); the verdict of :func:`summary`."""
    absent = missing("pgqueuer")
    if absent is not None:
        raise BenchFailure(absent)
    with pg.throwaway(args.postgres_admin, "troth_horizon_pgq") as conninfo:
        dsn = pg.as_uri(conninfo)
        await _install(dsn)
        queue = Queue(args.producers)
        worker = Worker(dsn, 10, 1, "continuous", workdir, queue.done)
        await worker.start()
        queue.worker, queue.app_pid = worker, worker.pid
        conns, queue.queries = await _queries(dsn, args.producers)
        try:
            samples = await windows(args, conninfo, queue)
        finally:
            await stop(worker, conns)
        for check in await _verify(dsn, worker, queue.reported, queue.enqueued):
            print(f"-- {check}")
    return summary(samples, "jobs", args.hold)
