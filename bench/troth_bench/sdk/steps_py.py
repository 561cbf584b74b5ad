"""N sequential ``ctx.run`` steps with the Python SDK (resonate-sdk 0.8.x), for
``troth bench --workloads sdk-steps`` (bench/troth_bench/sdk_steps.py).

Not part of troth's package code: it runs in the SDK's own Python 3.12 venv, started
by the bench as a child process, and imports only the SDK and the standard library.

    python steps_py.py URL|local N ID

Runs a short warm-up workflow (connections opened, code paths warm), prints
``warmed``, waits for a line on stdin (the bench reads troth's metrics meanwhile),
runs the measured workflow and prints one JSON line: the monotonic time (ms) at which each step's
function started, first call only (a step's promise, once resolved, is never run
again), and the workflow's wall time.  A step's latency is the gap between two
consecutive starts: the SDK's round trips to create the step's durable promise,
run it and settle it, and whatever the workflow does in between.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from resonate.context import Context
from resonate.resonate import Resonate
from resonate.retry import Never

STARTS: dict[str, dict[int, float]] = {}


async def step(ctx: Context, run: str, i: int) -> int:
    STARTS.setdefault(run, {}).setdefault(i, time.perf_counter() * 1000)
    return i


async def steps(ctx: Context, run: str, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.run(step, run, i)
    return total


async def main() -> None:
    target, n, wf = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if target == "local":
        r = Resonate(env={}, retry_policy=Never())
    else:
        r = Resonate(url=target, group="steps", retry_policy=Never())
    r.register(step)
    r.register(steps)
    try:
        warm = min(n, 20)
        got = await asyncio.wait_for(r.run(f"{wf}-warm", steps, "warm", warm).result(), 600)
        assert got == warm * (warm - 1) // 2, got
        print("warmed", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        began = time.perf_counter() * 1000
        got = await asyncio.wait_for(r.run(wf, steps, "run", n).result(), 3600)
        ended = time.perf_counter() * 1000
        assert got == n * (n - 1) // 2, got
    finally:
        await r.stop()
    starts = STARTS["run"]
    print(
        json.dumps(
            {
                "steps": n,
                "began": began,
                "ended": ended,
                "starts": [starts[i] for i in range(n)],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main())
