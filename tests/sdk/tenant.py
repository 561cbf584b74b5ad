"""A tenant's program for the auth tests (resonate-sdk 0.8.x): every id it names
starts with ``--prefix`` and its processes poll only the groups it is given, so a
prefix token (``RESONATE_TOKEN``, tests/sdk/test_sdk_auth.py) can cover all of it —
which the shared examples' fixed ids (``wf-``, ``fan-``, ``rpc-`` …) cannot.

    python tenant.py worker --url URL --group G           # runs remote_square
    python tenant.py client --url URL --group G --workers W --prefix P --suffix S
    python tenant.py probe  --url URL --group G --promise ID

``client`` runs a workflow (a child call, a durable sleep, an rpc to the workers'
group), an rpc fan-out and a top-level rpc, and prints one line each.  ``probe``
tries to read, create and settle ``--promise`` through the SDK's promise client and
prints ``<verb> -> <status>`` (the server's code, or ``ok <state>``).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from datetime import timedelta

from resonate.context import Context
from resonate.error import ResonateError
from resonate.resonate import Resonate
from resonate.retry import Never
from resonate.types import Value

WORKERS = "workers"


def say(*parts: object) -> None:
    print(*parts, flush=True)


async def greet(ctx: Context, name: str) -> str:
    return f"hello {name}"


async def remote_square(ctx: Context, x: int) -> int:
    return x * x


async def workflow(ctx: Context, name: str, workers: str) -> str:
    g = await ctx.run(greet, name)
    await ctx.sleep(timedelta(milliseconds=300))
    n = await ctx.options(target=workers).rpc("remote_square", 7)
    return f"{g}! {n}"


async def rpc_fanout(ctx: Context, n: int, workers: str) -> int:
    remote = ctx.options(target=workers)
    futures = [remote.rpc("remote_square", i) for i in range(n)]
    return sum([await f for f in futures])


async def client(r: Resonate, prefix: str, suffix: str, workers: str) -> None:
    for fn in (greet, workflow, rpc_fanout):
        r.register(fn)
    h1 = r.run(f"{prefix}wf-{suffix}", workflow, "world", workers)
    h2 = r.run(f"{prefix}fan-{suffix}", rpc_fanout, 5, workers)
    h3 = r.options(target=workers).rpc(f"{prefix}rpc-{suffix}", "remote_square", 9)
    say("workflow   ->", await asyncio.wait_for(h1.result(), 60))
    say("rpc_fanout ->", await asyncio.wait_for(h2.result(), 60))
    say("rpc        ->", await asyncio.wait_for(h3.result(), 60))


def outcome(exc: ResonateError) -> str:
    found = re.search(r"code=(\d+)", str(exc))
    return found[1] if found else f"{type(exc).__name__} {exc}"


async def probe(r: Resonate, id: str) -> None:
    far = int(time.time() * 1000) + 3_600_000
    attempts = {
        "get": lambda: r.promises.get(id),
        "create": lambda: r.promises.create(id, far, Value(data="x"), {}),
        "create_new": lambda: r.promises.create(f"{id}-new", far, Value(data="x"), {}),
        "resolve": lambda: r.promises.resolve(id, Value(data="forged")),
        "reject": lambda: r.promises.reject(id, Value(data="forged")),
        "cancel": lambda: r.promises.cancel(id, Value(data="forged")),
    }
    for verb, attempt in attempts.items():
        try:
            p = await attempt()
            say(f"{verb} -> ok {p.state}")
        except ResonateError as exc:
            say(f"{verb} -> {outcome(exc)}")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["worker", "client", "probe"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--group", default="default")
    ap.add_argument("--workers", default=WORKERS)
    ap.add_argument("--prefix", default="")
    ap.add_argument("--suffix", default="1")
    ap.add_argument("--promise", default="")
    ap.add_argument("--seconds", type=float, default=60.0)
    a = ap.parse_args()
    # RESONATE_TOKEN (the environment) carries the token, as an operator would set it.
    r = Resonate(url=a.url, group=a.group, retry_policy=Never())
    try:
        if a.mode == "worker":
            r.register(remote_square)
            say(f"worker ready group={a.group}")
            await asyncio.sleep(a.seconds)
        elif a.mode == "client":
            await client(r, a.prefix, a.suffix, a.workers)
        else:
            await probe(r, a.promise)
    finally:
        await r.stop()


if __name__ == "__main__":
    asyncio.run(main())
