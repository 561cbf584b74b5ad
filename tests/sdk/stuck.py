"""Workflows that get stuck in the usual ways, with the Python SDK (resonate-sdk
0.8.x), for ``troth explain``'s tests (tests/sdk/test_sdk_explain.py) and the
dashboard's (tests/ui/test_ui_sdk.py).

    python stuck.py --url URL --id ID --mode rpc|sleep|slow|done|push [--target URL]
        [--pid PID]

``rpc``: the workflow calls a function on group ``nobody``, where no worker runs;
``sleep``: it sleeps durably for ten minutes; ``slow``: a step runs for a minute
(the test SIGSTOPs the process in the middle of it); ``done``: a step that returns
at once, so the workflow finishes.  Each prints ``started <id>`` once the workflow
is under way, then waits for its result (``result -> …``).  ``push``: no workflow
runs here; a send-only client (no SSE source) calls ``charge`` on ``--target``
taken as an address as it is (an ``http://`` push URL), so troth delivers the task
there.

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
    if mode == "done":
        return str(await ctx.run(slow_step, 0.0))
    return str(await ctx.run(slow_step, 60.0))


async def push(url: str, id: str, target: str) -> None:
    """``charge(1)`` on ``target``, an address as it is (no source resolves it)."""
    c = Resonate(url=url, sources=[], resolve_target=lambda t: t, retry_policy=Never())
    handle = c.options(target=target).rpc(id, "charge", 1)
    print(f"started {id} pid={os.getpid()}", flush=True)
    try:
        print("result ->", await asyncio.wait_for(handle.result(), 300), flush=True)
    finally:
        await c.stop()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--id", required=True)
    ap.add_argument("--mode", choices=["rpc", "sleep", "slow", "done", "push"], required=True)
    ap.add_argument("--target", help="push: the address the task is delivered to")
    ap.add_argument("--pid", help="the SDK's process id (default: a random one)")
    a = ap.parse_args()
    if a.mode == "push":
        await push(a.url, a.id, a.target)
        return
    r = Resonate(url=a.url, group="stuck", pid=a.pid, retry_policy=Never())
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
