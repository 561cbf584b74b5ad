"""The shared Python example's workflows, with the SDK reaching troth only through
NATS: ``resonate-nats``'s ``NatsConnection`` as both network (requests) and source
(execute/unblock), as its documentation plugs it in.  The SDK is never told troth's
HTTP address.

  python nats_example.py worker NATS_URL EXAMPLES_DIR   # group "workers"
  python nats_example.py client NATS_URL EXAMPLES_DIR   # group "default", runs them
  python nats_example.py swarm  NATS_URL EXAMPLES_DIR --count 12 --fan 3 --sleep 1

The workflows and the client's output are shared/sdk-examples/example.py's own
(imported from EXAMPLES_DIR), so the expected lines are those of the HTTP test.
For the crash test (``test_cluster_nats.py``) the worker also serves recovery.py's
``slow_square`` (``--work`` seconds each, so that tasks are mid-run when a node is
killed), and ``swarm`` runs recovery.py's ``swarm`` workflows (an rpc, a durable
sleep, a fan-out of rpcs) ``--count`` at once beside the example's client, printing
the example's lines, then ``swarm I -> N`` for each.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import uuid
from datetime import timedelta

import nats
import recovery  # tests/sdk/recovery.py: slow_square and swarm
from resonate.resonate import Resonate
from resonate.retry import Never
from resonate_nats import NatsConnection


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["worker", "client", "swarm"])
    ap.add_argument("url")
    ap.add_argument("examples")
    ap.add_argument("--seconds", type=float, default=120.0, help="worker lifetime")
    ap.add_argument("--name", default="?", help="worker name printed in its lines")
    ap.add_argument("--work", type=float, default=1.0, help="seconds slow_square takes")
    ap.add_argument("--ttl", type=float, default=60.0, help="lease ttl in seconds")
    ap.add_argument("--request-timeout", type=float, default=30.0, help="NATS reply wait")
    ap.add_argument("--suffix", default=uuid.uuid4().hex[:8])
    ap.add_argument("--count", type=int, default=3)
    ap.add_argument("--fan", type=int, default=3)
    ap.add_argument("--sleep", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args()
    sys.path.insert(0, a.examples)
    import example  # shared/sdk-examples/example.py: the workflows and run_client

    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    recovery.NAME, recovery.WORK_SECONDS = a.name, a.work
    group = "workers" if a.mode == "worker" else "default"
    pid = uuid.uuid4().hex
    nc = await nats.connect(a.url)
    conn = NatsConnection(nc, pid=pid, group=group, request_timeout=a.request_timeout)
    r = Resonate(
        network=conn,
        sources=[conn],
        group=group,
        pid=pid,
        ttl=timedelta(seconds=a.ttl),
        retry_policy=Never(),
    )
    example.register_all(r, worker_fns=a.mode == "worker")
    try:
        if a.mode == "worker":
            r.register(recovery.slow_square)
            print(f"worker listening on NATS group={group} pid={pid}", flush=True)
            await asyncio.sleep(a.seconds)
        elif a.mode == "client":
            await example.run_client(r, a.suffix)
        else:
            r.register(recovery.swarm)
            args = (a.fan, a.sleep)
            handles = [
                r.run(f"swarm-{a.suffix}-{i}", recovery.swarm, i, *args) for i in range(a.count)
            ]
            await example.run_client(r, a.suffix)
            for i, h in enumerate(handles):
                print(f"swarm {i} ->", await asyncio.wait_for(h.result(), a.timeout), flush=True)
    finally:
        await r.stop()
        await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
