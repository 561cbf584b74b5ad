"""A task that keeps bouncing, with the Python SDK (resonate-sdk 0.8.x), for troth's
tests (tests/sdk/test_sdk_bounce.py).

    python bounce.py worker --url URL --group GROUP --kind lacking|having|poison
    python bounce.py start  --url URL --id ID --group GROUP

A ``lacking`` worker registers only ``other``: an ``execute`` for ``bounced`` finds no
function and the SDK releases the task, which troth offers again.  A ``poison`` worker
registers ``bounced`` but its body, after one durable step, raises an exception the SDK
does not settle as the function's failure (a ``BaseException``, as a crash of the
runtime would be): on every replay the SDK releases the task.  A ``having`` worker
runs it.  Workers print ``worker ready`` and run until killed; ``start`` prints
``result -> <value>`` when the rpc completes.

Needs Python >= 3.12 and ``pip install resonate-sdk``.
"""

from __future__ import annotations

import argparse
import asyncio

from resonate.context import Context
from resonate.resonate import Resonate
from resonate.retry import Never


class Unencodable:
    """A result the SDK's codec cannot encode: fulfilling the task fails in the SDK."""


def say(*parts: object) -> None:
    print(*parts, flush=True)


async def step(ctx: Context, x: str) -> str:
    return x


async def bounced(ctx: Context, x: str) -> str:
    await ctx.run(step, x)
    return f"ran {x}"


async def poisoned(ctx: Context, x: str) -> Unencodable:
    await ctx.run(step, x)
    say(f"replaying {x}")
    return Unencodable()


async def other(ctx: Context, x: str) -> str:
    return x


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["worker", "start"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--kind", choices=["lacking", "having", "poison"], default="having")
    ap.add_argument("--id", default="")
    ap.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args()

    if a.mode == "worker":
        r = Resonate(url=a.url, group=a.group, retry_policy=Never())
        r.register(other)
        r.register(step)
        if a.kind == "having":
            r.register(bounced, name="bounced")
        elif a.kind == "poison":
            r.register(poisoned, name="bounced")
        say("worker ready")
        try:
            await asyncio.Event().wait()  # until killed
        finally:
            await r.stop()
        return

    r = Resonate(url=a.url, group="clients")
    try:
        handle = r.options(target=a.group).rpc(a.id, "bounced", a.id)
        say("result ->", await asyncio.wait_for(handle.result(), a.timeout))
    finally:
        await r.stop()


if __name__ == "__main__":
    asyncio.run(main())
