"""Two troth nodes on one PostgreSQL database sharing the NATS queue group, the real
Python SDK over NATS only, and one node SIGKILLed mid-run.

* a throwaway PostgreSQL database, the test's own ``nats-server``, and two
  ``troth serve --store postgres --nats-url`` processes (``n1``, ``n2``): NATS hands
  each request to one of them (queue group ``troth``), and either may deliver any
  ``nats://`` execute (no routing to a connection holder);
* three ``resonate-sdk`` 0.8.1 worker processes with ``resonate-nats``'s
  ``NatsConnection`` as network and source (group ``workers``), serving the shared
  example's functions and recovery.py's ``slow_square`` (1 s each); they know only
  the NATS URL;
* one client process, also NATS-only, running ``COUNT`` ``swarm`` workflows at once
  (an rpc to the group, a durable sleep, a fan-out of rpcs) beside the shared
  example's client (a call, a durable sleep, local fan-out, rpc fan-out, top-level
  rpc, an idempotent re-run);
* once several ``slow_square`` calls have started and both nodes have granted tasks,
  SIGKILL of the node that granted more.

Then every workflow must return the right value (read back over HTTP from the
survivor too), the survivor must declare the dead node gone within ``node_timeout``
(its presence row removed, every outbox claim it held reaped and settled), no
``(task, version)`` may appear twice among the grants both nodes logged, the survivor
must have served requests over NATS after the kill, and its log must hold no error.

A request the killed node had taken is lost with it: NATS has no redelivery, so the
SDK waits out its request timeout (``--request-timeout``, 10 s here) and the task it
belonged to comes back when its lease runs out (``--ttl``).  The waits are generous
for that reason; nothing asserts how fast recovery is.
"""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest

from helpers.cluster import (
    Node,
    granted_twice,
    live_nodes,
    swarm_value,
    unsettled_claims,
)
from helpers.nats import NatsServer
from helpers.sdk_env import (
    EXAMPLE_PY,
    SHARED_EXAMPLES,
    Proc,
    Procs,
    PythonSdk,
)

pytestmark = pytest.mark.timeout(420)

COUNT = 12
FAN = 3
SLEEP_S = 1.0
WORK_S = 1.0
#: The SDKs' lease: a task whose request died with the node comes back after it.
TTL_S = 5
#: How long an SDK waits for a reply over NATS before giving the request up.
REQUEST_TIMEOUT_S = 10
WORKERS = ("A", "B", "C")
KILL_AFTER_STARTS = COUNT // 2
#: Bound on the client program (undisturbed it takes a few seconds).
RUN_TIMEOUT = 180.0
ACCESS_NATS = re.compile(r"troth\.access \S+ corrId=\S+ status=\d+ .*via=nats")


def started(workers: dict[str, Proc]) -> int:
    return sum(w.out().count("START slow_square") for w in workers.values())


@pytest.mark.parametrize("store", ["postgres"])  # the shared postgres_url and procs fixtures
def test_two_nodes_on_one_queue_group_one_killed_mid_run(
    nats_sdk: PythonSdk, broker: NatsServer, postgres_url: str, procs: Procs
) -> None:
    t0 = time.monotonic()
    nodes = {name: Node(procs, name, postgres_url) for name in ("n1", "n2")}
    nodes["n1"].start("--nats-url", broker.url)  # first alone: it creates the schema
    procs.wait_for("n1 to answer GET /ready", nodes["n1"].ready, 30)
    nodes["n2"].start("--nats-url", broker.url)
    for node in nodes.values():
        procs.wait_for(f"{node.name} to answer GET /ready", node.ready, 30)
        procs.wait_for(
            f"{node.name} to serve NATS requests",
            lambda node=node: "serving requests on" in node.proc.err(),  # type: ignore[union-attr]
            30,
        )
    n1, n2 = nodes.values()

    examples = str(SHARED_EXAMPLES)
    common = ["--ttl", str(TTL_S), "--request-timeout", str(REQUEST_TIMEOUT_S)]
    workers: dict[str, Proc] = {}
    for name in WORKERS:
        argv = ["worker", broker.url, examples, "--name", name, "--work", str(WORK_S), *common]
        argv += ["--seconds", str(RUN_TIMEOUT + 60)]
        workers[name] = procs.start(f"worker-{name}", nats_sdk.program("nats_example.py", *argv))
    for w in workers.values():
        procs.wait_line(w, r"^worker listening", 30)

    swarm = ["swarm", broker.url, examples, "--suffix", "k", "--count", str(COUNT)]
    swarm += ["--fan", str(FAN), "--sleep", str(SLEEP_S), "--timeout", str(RUN_TIMEOUT), *common]
    client = procs.start("client", nats_sdk.program("nats_example.py", *swarm))
    run_started = time.monotonic()

    def both_granted() -> bool:
        return all(n.grants() for n in nodes.values())

    procs.wait_for(
        f"{KILL_AFTER_STARTS} slow_square calls to start and both nodes to grant tasks",
        lambda: started(workers) >= KILL_AFTER_STARTS and both_granted(),
        60,
    )
    victim = max(nodes.values(), key=lambda n: len(n.grants()))
    survivor = n2 if victim is n1 else n1
    killed_at = victim.kill_at()
    killed_mono = time.monotonic()
    starts_at_kill = started(workers)
    grants_at_kill = len(victim.grants())
    print(
        f"killed {victim.name} {killed_mono - run_started:.2f} s into the run; "
        f"{starts_at_kill} calls started, {grants_at_kill} tasks granted by {victim.name}"
    )

    # -- every workflow completes with the right value ---------------------------------
    procs.wait_exit(client, RUN_TIMEOUT + 30)
    done_s = time.monotonic() - killed_mono
    lines = client.out().splitlines()
    example_lines = [x for x in lines if not x.startswith(("swarm", "elapsed "))]
    assert example_lines == EXAMPLE_PY, client.out() + client.err()
    swarms = [x for x in lines if x.startswith("swarm ")]
    assert swarms == [f"swarm {i} -> {swarm_value(i, FAN)}" for i in range(COUNT)], client.out()
    for i in range(COUNT):
        assert survivor.promise_value(f"swarm-k-{i}") == ("resolved", swarm_value(i, FAN))
    assert started(workers) > starts_at_kill, "nothing ran after the kill"

    # -- the survivor declared the killed node dead: presence gone, claims reaped ------
    procs.wait_for(
        f"{survivor.name} to declare {victim.name} dead (node_timeout)",
        lambda: live_nodes(postgres_url) == {survivor.name},
        30,
    )
    procs.wait_for(
        f"{victim.name}'s outbox claims to be reaped and settled",
        lambda: unsettled_claims(postgres_url, victim.name) == 0,
        30,
    )

    # -- no task version granted twice, across both nodes ------------------------------
    grants = [g for n in nodes.values() for g in n.grants()]
    assert (twice := granted_twice(grants)) is None, twice
    per_node = Counter(g.node for g in grants)
    assert per_node[victim.name] == grants_at_kill >= 1, per_node
    after_kill = [g for g in grants if g.node == survivor.name and g.at >= killed_at - 0.01]
    assert after_kill, f"the survivor granted no task after the kill: {per_node}"

    # -- the survivor served requests over NATS (none over HTTP but the test's reads),
    # delivered over NATS, and logged no error ---------------------------------------
    assert survivor.proc is not None
    log = survivor.proc.err().splitlines()
    assert any(ACCESS_NATS.search(line) for line in log)
    sends = survivor.dispatch_outcomes()
    assert sends.get("completed", 0) > 0, sends
    problems = survivor.problems()
    assert not problems, "the survivor logged errors:\n" + "\n".join(problems[:40])
    print(
        f"sends by {survivor.name} {sends}; grants per node {dict(per_node)}; all workflows "
        f"done {done_s:.2f} s after the kill; test took {time.monotonic() - t0:.1f} s"
    )
