"""Workflows of N sequential ``ctx.run`` steps under load, with the Python SDK
(resonate-sdk 0.8.x), for ``troth bench --workloads sdk-workflows``
(bench/troth_bench/sdk_load.py).

Not part of troth's package code: it runs in the SDK's own Python 3.12 venv, started
by the bench as a child process (one per SDK worker process), and imports only the
SDK, the standard library and, for the resonate-pg peer, ``resonate_pg``.

    python workflows_py.py TARGET STEPS GROUP PREFIX

TARGET is a troth URL (``http://…``) or ``pg:`` followed by a libpq connection
string (resonate-pg's ``PostgresConnection``: the database is the server).  GROUP is
this process's own group, so the workflows it starts run in it and the step times
it records are its own.  It runs one warm-up workflow, prints ``warmed``, then reads
commands from stdin and answers each with one JSON line:

* ``single N`` — N workflows one after the other;
* ``batch N K`` — N workflows, K in flight at once;
* ``quit``.

The answer holds, per workflow, its wall time and the gaps between consecutive
steps' starts (a step's latency: the SDK's round trips to create its durable
promise, run it and settle it), and the phase's first start and last end on the
monotonic clock the bench shares (``time.perf_counter``, CLOCK_MONOTONIC).
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import json
import sys
import time
from typing import Any

from resonate.context import Context
from resonate.resonate import Resonate
from resonate.retry import Never

STARTS: dict[str, dict[int, float]] = {}


async def step(ctx: Context, run: str, i: int) -> int:
    STARTS.setdefault(run, {}).setdefault(i, time.perf_counter())
    return i


async def steps(ctx: Context, run: str, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.run(step, run, i)
    return total


def connect(target: str, group: str) -> Resonate:
    if target.startswith("pg:"):
        # Imported by name: only the resonate-pg peer's venv has it.
        connector = importlib.import_module("resonate_pg")
        conn = connector.PostgresConnection(target[3:], group=group)
        return Resonate(network=conn, group=group, retry_policy=Never())
    return Resonate(url=target, group=group, retry_policy=Never())


class Runner:
    def __init__(self, r: Resonate, n: int, prefix: str) -> None:
        self.r = r
        self.n = n
        self.prefix = prefix
        self.ids = itertools.count()

    async def one(self) -> tuple[float, list[float]]:
        wf = f"{self.prefix}-{next(self.ids)}"
        began = time.perf_counter()
        got = await asyncio.wait_for(self.r.run(wf, steps, wf, self.n).result(), 600)
        ended = time.perf_counter()
        assert got == self.n * (self.n - 1) // 2, got
        starts = STARTS.pop(wf)
        if sorted(starts) != list(range(self.n)):
            raise RuntimeError(f"{wf}: steps missing")
        ordered = [starts[i] for i in range(self.n)]
        gaps = [(b - a) * 1000 for a, b in itertools.pairwise(ordered)]
        return (ended - began) * 1000, gaps

    async def phase(self, count: int, inflight: int) -> dict[str, Any]:
        slots = asyncio.Semaphore(max(1, inflight))
        walls: list[float] = []
        gaps: list[float] = []

        async def guarded() -> None:
            async with slots:
                wall, g = await self.one()
                walls.append(wall)
                gaps.extend(g)

        began = time.perf_counter()
        await asyncio.gather(*(guarded() for _ in range(count)))
        ended = time.perf_counter()
        return {"began": began, "ended": ended, "walls": walls, "gaps": gaps}


async def main() -> None:
    target, n, group, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    r = connect(target, group)
    r.register(step)
    r.register(steps)
    runner = Runner(r, n, prefix)
    loop = asyncio.get_running_loop()
    try:
        await runner.one()
        print("warmed", flush=True)
        while line := (await loop.run_in_executor(None, sys.stdin.readline)).split():
            if line[0] == "single":
                out = await runner.phase(int(line[1]), 1)
            elif line[0] == "batch":
                out = await runner.phase(int(line[1]), int(line[2]))
            else:
                break
            print(json.dumps(out), flush=True)
    finally:
        await r.stop()


if __name__ == "__main__":
    asyncio.run(main())
