"""A slow workflow for ``troth cancel`` with the Python SDK (resonate-sdk 0.8.x), for
tests/sdk/test_sdk_cancel.py.

    python cancel.py --url URL --group GROUP --id ID --steps N --other ID2 --other-steps M

Runs workflow ID (N sequential ``ctx.run`` steps of 0.3 s) and, beside it in the same
worker, workflow ID2 (M steps).  Every step prints ``start <workflow> <i> <unix time>``
as it begins; each workflow ends with ``result <workflow> <value>`` or
``error <workflow> <exception>`` (or ``gave-up <workflow>`` after --timeout).

Needs Python >= 3.12 and ``pip install resonate-sdk``.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from resonate.context import Context
from resonate.resonate import Resonate
from resonate.retry import Never

STEP_SECONDS = 0.3


def say(*parts: object) -> None:
    print(*parts, flush=True)


async def step(ctx: Context, wf: str, i: int) -> int:
    say(f"start {wf} {i} {time.time():.3f}")
    await asyncio.sleep(STEP_SECONDS)
    return i


async def slow(ctx: Context, wf: str, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.run(step, wf, i)
    return total


async def follow(r: Resonate, wf: str, n: int, timeout: float) -> None:
    try:
        value = await asyncio.wait_for(r.run(wf, slow, wf, n).result(), timeout)
        say(f"result {wf} {value}")
    except TimeoutError:
        say(f"gave-up {wf}")
    except Exception as exc:  # what the SDK raises for a cancelled workflow
        say(f"error {wf} {type(exc).__name__}: {exc}")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--group", default="cancel")
    ap.add_argument("--id", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--other", required=True)
    ap.add_argument("--other-steps", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=20.0)
    a = ap.parse_args()
    r = Resonate(url=a.url, group=a.group, retry_policy=Never())
    r.register(slow)
    try:
        await asyncio.gather(
            follow(r, a.id, a.steps, a.timeout), follow(r, a.other, a.other_steps, a.timeout)
        )
    finally:
        await r.stop()
    say("done")


if __name__ == "__main__":
    asyncio.run(main())
