"""Human in the loop with the Python SDK (resonate-sdk 0.8.x), for troth's tests.

The workflow waits on a durable promise (``ctx.promise()``, which the SDK tags
``resonate:scope: global`` and ``resonate:external: "true"``) that someone else
settles later (tests/test_sdk_hitl.py).

    python hitl.py run    --url URL --id ID --group GROUP
    python hitl.py settle --url URL --promise PROMISE_ID --value VALUE

``run`` prints ``awaiting <promise id>`` each time the workflow body reaches the
wait (once per replay) and ``result -> <value>`` at the end; ``settle`` resolves
the promise through the SDK's promise client and prints ``settled <id> <state>``.

Needs Python >= 3.12 and ``pip install resonate-sdk``.
"""

from __future__ import annotations

import argparse
import asyncio

from resonate.context import Context
from resonate.resonate import Resonate
from resonate.retry import Never
from resonate.types import Value


def say(*parts: object) -> None:
    """Print one line at once: the tests read stdout while the process runs."""
    print(*parts, flush=True)


async def approval(ctx: Context, request: str) -> str:
    answer = ctx.promise()
    say(f"awaiting {await answer.id()}")
    verdict = await answer
    return f"{request}: {verdict}"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["run", "settle"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--id", default="hitl")
    ap.add_argument("--group", default="default")
    ap.add_argument("--promise", default="")
    ap.add_argument("--value", default="yes")
    ap.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args()

    if a.mode == "run":
        r = Resonate(url=a.url, group=a.group, retry_policy=Never())
        r.register(approval)
        try:
            handle = r.run(a.id, approval, f"request {a.id}")
            say("result ->", await asyncio.wait_for(handle.result(), a.timeout))
        finally:
            await r.stop()
        return

    r = Resonate(url=a.url, group="settlers")
    try:
        p = await r.promises.resolve(a.promise, Value(data=a.value))
        say(f"settled {p.id} {p.state}")
    finally:
        await r.stop()


if __name__ == "__main__":
    asyncio.run(main())
