"""Workflows that get stuck in the usual ways, with the Python SDK (resonate-sdk
0.8.x), for ``troth explain``'s tests (tests/sdk/test_sdk_explain.py).

    python stuck.py --url URL --id ID --mode rpc|sleep|slow

``rpc``: the workflow calls a function on group ``nobody``, where no worker runs;
``sleep``: it sleeps durably for ten minutes; ``slow``: a step runs for a minute
(the test SIGSTOPs the process in the middle of it).  Each prints ``started <id>``
once the workflow is under way, then waits.

Needs Python >= 3.12 and ``pip install resonate-sdk``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from datetime import timedelta

from resonate.context import Context
from resonate.resonate import Resonate
from resonate.retry import Never


async def slow_step(ctx: Context, seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "slept"


async def stuck(ctx: Context, mode: str) -> str:
    if mode == "rpc":
        return str(await ctx.options(target="nobody").rpc("absent", 1))
    if mode == "sleep":
        await ctx.sleep(timedelta(minutes=10))
        return "woke"
    return str(await ctx.run(slow_step, 60.0))


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--id", required=True)
    ap.add_argument("--mode", choices=["rpc", "sleep", "slow"], required=True)
    a = ap.parse_args()
    r = Resonate(url=a.url, group="stuck", retry_policy=Never())
    r.register(stuck)
    r.register(slow_step)
    handle = r.run(a.id, stuck, a.mode)
    print(f"started {a.id} pid={os.getpid()}", flush=True)
    try:
        print("result ->", await asyncio.wait_for(handle.result(), 300), flush=True)
    finally:
        await r.stop()


if __name__ == "__main__":
    asyncio.run(main())
