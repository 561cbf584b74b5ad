"""The rest of an operator's mixed load, beside retention's workflow clients
(``python -m troth_bench.retention --backlog S --mixed``): ``lifecycle`` (a targeted
``promise.create``, its ``execute`` over SSE, ``task.acquire``, ``task.fulfill``)
and ``reads`` (``promise.get`` of pending promises seeded once), each counted per
window.  Enabling retention on a busy server slows every kind of request that
shares the writer (lifecycle) and the readers (reads), not only the workflows
retention deletes, so the verdict looks at all three."""

from __future__ import annotations

import asyncio
import random
import time
from argparse import Namespace
from dataclasses import dataclass, field

from troth_bench.client import FAR, BenchFailure, Client, promise_of
from troth_bench.horizon import Lifecycle
from troth_bench.procs import ServerProcess
from troth_bench.workloads import parallel

#: Pending promises the reads draw from (seeded in the first phase: retention keeps
#: them, since they never settle).
READS_IDS = 2_000


def p99_ms(latencies: list[float]) -> float:
    """Nearest-rank p99 of seconds, in ms (0 with none)."""
    ordered = sorted(latencies) or [0.0]
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


@dataclass
class Reads:
    """``clients`` connections reading ids at random without pause."""

    clients: list[Client]
    ids: list[str]
    count: int = 0
    latencies: list[float] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    async def open(cls, port: int, clients: int, seed: bool) -> Reads:
        conns = [await Client.open("127.0.0.1", port, f"rd-c{i}") for i in range(clients)]
        ids = [f"mixed-rd-{k}" for k in range(READS_IDS)]
        if seed:

            async def create(c: Client, id: str) -> None:
                await c.ok("promise.create", {"id": id, "timeoutAt": FAR, "param": {}, "tags": {}})

            await parallel(conns, ids, create)
        return cls(conns, ids)

    def start(self, stop: float) -> None:
        self.tasks = [
            asyncio.create_task(self._client(k, c, stop)) for k, c in enumerate(self.clients)
        ]

    async def _client(self, k: int, c: Client, stop: float) -> None:
        rng = random.Random(k)
        while time.monotonic() < stop:
            id = self.ids[rng.randrange(len(self.ids))]
            body, seconds = await c.ok("promise.get", {"id": id})
            if promise_of(body, "promise.get").get("state") != "pending":
                raise BenchFailure(f"promise.get of {id}: not pending: {body!r}")
            self.count += 1
            self.latencies.append(seconds)

    def close(self) -> tuple[int, list[float]]:
        """The window's reads and their latencies; the counts start again."""
        out = (self.count, self.latencies)
        self.count, self.latencies = 0, []
        return out

    async def finish(self) -> None:
        await asyncio.gather(*self.tasks)
        for c in self.clients:
            c.close()


@dataclass
class Beside:
    """Lifecycle and reads running beside the workflow clients of one phase."""

    lifecycle: Lifecycle
    reads: Reads

    @classmethod
    async def open(
        cls, server: ServerProcess, lifecycle: int, workers: int, reads: int, seed: bool
    ) -> Beside:
        unpaced = Namespace(clients=lifecycle, workers=workers, rate=None)
        life = await Lifecycle.open(unpaced, server)
        return cls(life, await Reads.open(server.port, reads, seed))

    def start(self, stop: float) -> None:
        self.lifecycle.start(stop)
        self.reads.start(stop)

    def close(self, seconds: float) -> tuple[float, float, float]:
        """Tasks per second, lifecycle request p99 (ms) and reads per second of the
        window that just ended."""
        tasks, latencies = self.lifecycle.load.close()
        reads, _ = self.reads.close()
        return tasks / seconds, p99_ms(latencies), reads / seconds

    async def finish(self) -> None:
        await asyncio.gather(*self.lifecycle.tasks, return_exceptions=False)
        await self.lifecycle.finish()
        await self.reads.finish()
