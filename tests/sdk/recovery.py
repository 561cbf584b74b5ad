"""Resonate Python SDK (resonate-sdk 0.8.x) driver for troth's recovery tests.

The shared examples finish in about a second, too fast to kill anything in the
middle of them, so these workflows are built to be interrupted:

* ``worker``   joins group ``workers`` with a short lease (``--ttl``) and serves
  ``slow_square`` (prints ``START``, sleeps ``--work`` seconds in plain asyncio,
  prints ``DONE``) and ``remote_square``.  Killing it while ``slow_square`` runs
  leaves a task whose lease must expire so another worker can take it over.
* ``relay``    runs workflow ``relay`` = ``slow_square`` over rpc, plus one, and
  prints ``relay -> N``.
* ``nap``      runs ``--count`` workflows ``nap`` = local child, durable sleep of
  ``--sleep`` seconds, then an rpc to ``remote_square``; prints ``napping I``
  before each sleep (again on every replay) and ``nap I -> I*I`` at the end.
  Killing the server during the sleep tests that every step survives a restart.
* ``swarm``    runs ``--count`` workflows ``swarm`` at once, each = an rpc to
  ``slow_square(i)``, a durable sleep of ``--sleep`` seconds, then a fan-out of
  ``--fan`` rpcs ``slow_square(i + 1 .. i + fan)``; prints ``swarming I`` before
  each sleep and ``swarm I -> i*i + sum((i+j)**2 for j in 1..fan)`` at the end.
  Many tasks and timers in flight at once: killing one of several nodes mid-run
  tests that nothing is lost with it.

    python recovery.py worker --url URL --name A [--ttl 2] [--work 3] [--log-sse]
    python recovery.py relay  --url URL --id relay-1 [--x 7]
    python recovery.py nap    --url URL --suffix s [--count 3] [--sleep 2]
    python recovery.py swarm  --url URL --suffix s [--count 3] [--fan 3] [--sleep 2]

``--log-sse`` makes the SDK's SSE listener log its (re)connections on stderr.

Needs Python >= 3.12 and ``pip install resonate-sdk``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from datetime import timedelta

from resonate.context import Context
from resonate.resonate import Resonate
from resonate.retry import Never

#: Set from the command line; module globals so the durable functions can read them.
NAME = "?"
WORK_SECONDS = 3.0


def say(*parts: object) -> None:
    """Print one line at once: the tests read stdout while the process runs."""
    print(*parts, flush=True)


async def slow_square(ctx: Context, x: int) -> int:
    say(f"START slow_square({x}) on {NAME} at {time.time():.3f}")
    await asyncio.sleep(WORK_SECONDS)
    say(f"DONE slow_square({x}) on {NAME} at {time.time():.3f}")
    return x * x


async def remote_square(ctx: Context, x: int) -> int:
    return x * x


async def relay(ctx: Context, x: int) -> int:
    value = await ctx.options(target="workers").rpc("slow_square", x)
    return value + 1


async def greet(ctx: Context, name: str) -> str:
    return f"hello {name}"


async def nap(ctx: Context, i: int, seconds: float) -> int:
    await ctx.run(greet, str(i))
    say(f"napping {i}")
    await ctx.sleep(timedelta(seconds=seconds))
    return await ctx.options(target="workers").rpc("remote_square", i)


async def swarm(ctx: Context, i: int, fan: int, seconds: float) -> int:
    remote = ctx.options(target="workers")
    first = await remote.rpc("slow_square", i)
    say(f"swarming {i}")
    await ctx.sleep(timedelta(seconds=seconds))
    futures = [remote.rpc("slow_square", i + j) for j in range(1, fan + 1)]
    return first + sum([await f for f in futures])


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["worker", "relay", "nap", "swarm"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--name", default="?", help="worker name printed in its lines")
    ap.add_argument("--ttl", type=float, default=60.0, help="lease ttl in seconds")
    ap.add_argument("--work", type=float, default=3.0, help="seconds slow_square takes")
    ap.add_argument("--seconds", type=float, default=120.0, help="worker lifetime")
    ap.add_argument("--id", default="relay")
    ap.add_argument("--x", type=int, default=7)
    ap.add_argument("--suffix", default="s")
    ap.add_argument("--count", type=int, default=3)
    ap.add_argument("--sleep", type=float, default=2.0)
    ap.add_argument("--fan", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--log-sse", action="store_true", help="log SSE (re)connections")
    a = ap.parse_args()
    # --log-sse: timestamps too, to line reconnections up with the servers' logs
    stamped = "%(asctime)s %(levelname)s %(name)s %(message)s"
    logging.basicConfig(
        level=logging.WARNING, format=stamped if a.log_sse else logging.BASIC_FORMAT
    )
    if a.log_sse:
        logging.getLogger("resonate.connections.sse").setLevel(logging.INFO)
    global NAME, WORK_SECONDS
    NAME, WORK_SECONDS = a.name, a.work
    ttl = timedelta(seconds=a.ttl)

    if a.mode == "worker":
        r = Resonate(url=a.url, group="workers", ttl=ttl, retry_policy=Never())
        r.register(slow_square)
        r.register(remote_square)
        say(f"worker {a.name} ready pid={r._pid}")
        try:
            await asyncio.sleep(a.seconds)
        finally:
            await r.stop()
        return

    r = Resonate(url=a.url, group="default", ttl=ttl, retry_policy=Never())
    r.register(relay)
    r.register(greet)
    r.register(nap)
    r.register(swarm)
    try:
        if a.mode == "relay":
            handle = r.run(a.id, relay, a.x)
            say("relay ->", await asyncio.wait_for(handle.result(), a.timeout))
        elif a.mode == "swarm":
            args = (a.fan, a.sleep)
            handles = [r.run(f"swarm-{a.suffix}-{i}", swarm, i, *args) for i in range(a.count)]
            for i, h in enumerate(handles):
                say(f"swarm {i} ->", await asyncio.wait_for(h.result(), a.timeout))
        else:
            handles = [r.run(f"nap-{a.suffix}-{i}", nap, i, a.sleep) for i in range(a.count)]
            for i, h in enumerate(handles):
                say(f"nap {i} ->", await asyncio.wait_for(h.result(), a.timeout))
    finally:
        await r.stop()


if __name__ == "__main__":
    asyncio.run(main())
