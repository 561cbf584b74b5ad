"""The shared Python example's workflows, with the SDK reaching troth only through
NATS: ``resonate-nats``'s ``NatsConnection`` as both network (requests) and source
(execute/unblock), as its documentation plugs it in.  The SDK is never told troth's
HTTP address.

  python nats_example.py worker NATS_URL EXAMPLES_DIR   # group "workers"
  python nats_example.py client NATS_URL EXAMPLES_DIR   # group "default", runs them

The workflows and the client's output are shared/sdk-examples/example.py's own
(imported from EXAMPLES_DIR), so the expected lines are those of the HTTP test.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import uuid

import nats
from resonate.resonate import Resonate
from resonate.retry import Never
from resonate_nats import NatsConnection


async def main() -> None:
    mode, url, examples = sys.argv[1], sys.argv[2], sys.argv[3]
    sys.path.insert(0, examples)
    import example  # shared/sdk-examples/example.py: the workflows and run_client

    logging.basicConfig(level=logging.WARNING)
    group = "workers" if mode == "worker" else "default"
    pid = uuid.uuid4().hex
    nc = await nats.connect(url)
    conn = NatsConnection(nc, pid=pid, group=group)
    r = Resonate(network=conn, sources=[conn], group=group, pid=pid, retry_policy=Never())
    example.register_all(r, worker_fns=mode == "worker")
    try:
        if mode == "worker":
            print(f"worker listening on NATS group={group} pid={pid}", flush=True)
            await asyncio.sleep(float(sys.argv[4]) if len(sys.argv) > 4 else 120.0)
        else:
            await example.run_client(r, uuid.uuid4().hex[:8])
    finally:
        await r.stop()
        await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
