"""A fan-out of RPCs to a worker group with a concurrency limit, with the Python SDK
(resonate-sdk 0.8.x), for tests/sdk/test_sdk_limits.py (the TypeScript twin is
tests/sdk/limits_ts.mjs).

    python limits.py worker --url URL --group G --name W [--ttl S] [--max-tasks N] [--sleep S]
    python limits.py client --url URL --target G --id ID --steps N --seconds S

``worker`` joins group G and runs ``step`` until it is killed; every step prints
``start <worker> <i> <unix time>`` when it begins and ``end <worker> <i> <unix time>``
when its sleep is over (before the SDK fulfils its task), so the printed interval lies
within the one its task held a slot.  ``client`` (group ``driver``) runs workflow ID,
which fans out N ``step`` RPCs of S seconds to group G and returns the sum of their
squares, and prints ``result <id> <value>`` (or ``error``/``gave-up``).  ``--ttl`` is
the SDK's task lease; ``--max-tasks`` its own bound on tasks it runs at once;
``--sleep`` makes every step of this worker take that long instead.

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

#: This worker's name in its ``start``/``end`` lines.
NAME = "?"
#: How long this worker's steps take (``--sleep``), whatever the workflow asks.
SLEEP: float | None = None


def say(*parts: object) -> None:
    print(*parts, flush=True)


async def step(ctx: Context, i: int, seconds: float) -> int:
    say(f"start {NAME} {i} {time.time():.6f}")
    await asyncio.sleep(SLEEP if SLEEP is not None else seconds)
    say(f"end {NAME} {i} {time.time():.6f}")
    return i * i


async def fanout(ctx: Context, n: int, seconds: float, target: str) -> int:
    remote = ctx.options(target=target)
    futures = [remote.rpc("step", i, seconds) for i in range(n)]
    return sum([await f for f in futures])


async def worker(a: argparse.Namespace) -> None:
    global NAME, SLEEP
    NAME, SLEEP = a.name, a.sleep
    r = Resonate(
        url=a.url,
        group=a.group,
        retry_policy=Never(),
        ttl=timedelta(seconds=a.ttl) if a.ttl else None,
        max_concurrent_tasks=a.max_tasks,
    )
    r.register(step)
    say(f"worker {a.name} group={a.group} pid={r._pid}")
    try:
        await asyncio.Event().wait()
    finally:
        await r.stop()


async def client(a: argparse.Namespace) -> None:
    r = Resonate(url=a.url, group="driver", retry_policy=Never())
    r.register(fanout)
    try:
        handle = r.run(a.id, fanout, a.steps, a.seconds, a.target)
        value = await asyncio.wait_for(handle.result(), a.timeout)
        say(f"result {a.id} {value}")
    except TimeoutError:
        say(f"gave-up {a.id}")
    except Exception as exc:
        say(f"error {a.id} {type(exc).__name__}: {exc}")
    finally:
        await r.stop()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["worker", "client"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--group", default="limited")
    ap.add_argument("--name", default="w")
    ap.add_argument("--ttl", type=float, default=0.0, help="task lease, seconds (0: SDK's)")
    ap.add_argument("--max-tasks", type=int, default=None)
    ap.add_argument("--sleep", type=float, default=None, help="worker: seconds every step takes")
    ap.add_argument("--target", default="limited")
    ap.add_argument("--id", default="fanout")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=0.2)
    ap.add_argument("--timeout", type=float, default=50.0)
    a = ap.parse_args()
    # The SDK logs what it drops (a refused task.acquire among them) at ERROR.
    logging.basicConfig(level=logging.WARNING, format="%(created).6f %(levelname)s %(message)s")
    await (worker(a) if a.mode == "worker" else client(a))


if __name__ == "__main__":
    asyncio.run(main())
