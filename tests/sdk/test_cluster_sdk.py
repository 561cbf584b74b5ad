"""Three troth nodes on one PostgreSQL database, the real Python SDK, and a crash.

A node that dies must lose nothing: its claims are reaped, the
workers that were connected to it reconnect to another node, and every workflow
completes, with no task version granted twice.  This test builds that setting
with real processes:

* a throwaway PostgreSQL database and three ``troth serve --store postgres``
  processes on it (``n1``, ``n2``, ``n3``);
* a TCP load balancer (``tests/helpers/lb.py``) in front of ``n1`` and ``n2``, through
  which three ``resonate-sdk`` 0.8.1 worker processes (group ``workers``) hold
  their SSE streams and send their requests; round robin spreads each worker's
  connections over both nodes;
* the client program attached directly to ``n3``, so every rpc it makes must be
  delivered by another node (the one holding a worker's stream), and every
  result must come back to it across nodes too;
* a batch of ``swarm`` workflows (``tests/sdk/recovery.py``): an rpc, a durable
  sleep, then a fan-out of rpcs, all in flight at once;
* once tasks are running, SIGKILL of whichever of ``n1``/``n2`` holds the most
  worker streams and has granted tasks.

Cross-node delivery is checked on the way: ``n3`` holds no worker stream, so each
of its sends must be to the client and must complete (a message for a worker that
``n3`` claimed would be retried for want of a connection).

Then every workflow must return the right value, the workers' streams must have
been reopened on the surviving node through the balancer (by the same SDK
processes), a survivor must declare the killed node dead within ``node_timeout``
(its row and published connections gone, every outbox claim it held reaped and
settled), no ``(task, version)`` may appear twice among
the ``troth.grants`` lines of all nodes (the killed one included: a grant is logged
before it is answered, though after its commit, so one committed in the dead node's
last instant may be missing), and the surviving nodes' logs must hold no error: no
traceback, no ERROR line, no request answered 5xx.  Warnings are allowed: a
survivor reports the dead peer and the claims it reaped at WARNING, which is what
it should do.  The workers' own logs are not checked: an SDK whose request was cut
by the crash retries it on the survivor and may get a 409 (its ``task.acquire`` was
granted by the dead node just before it died; the lease then runs out and the task
is offered again at the next version), which the SDK logs as an error.

The nodes carry ``--server-url`` = the balancer's URL (what execute messages tell
workers, ``head.serverUrl``): the Python SDK ignores it and always answers on the
URL it was given, but it is what an operator sets behind a balancer.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from helpers.cluster import Node, granted_twice, live_nodes, query, swarm_value, unsettled_claims
from helpers.lb import LoadBalancer
from helpers.pg import throwaway_database
from helpers.sdk_env import Proc, Procs, PythonSdk, build_python_sdk

pytestmark = pytest.mark.timeout(150)

#: Re-dispatch pending tasks every second, so a task whose execute was lost with
#: the killed node is offered again quickly.
RETRY_TIMEOUT_MS = 1000
#: The workers' lease; they heartbeat every ttl/2.  Longer than the SDK's first
#: reconnect back-offs (1 s, 2 s) so a lease normally survives the crash; a task
#: whose acquire was granted by the dead node but never answered waits it out.
WORKER_TTL_S = 5
#: Seconds each slow_square holds its task: long enough to be mid-run at the kill.
WORK_S = 1.0
#: Workflows, rpcs fanned out by each after its sleep, and the sleep itself.
COUNT = 12
FAN = 3
SLEEP_S = 1.0
WORKERS = ("A", "B", "C")
#: Kill once this many slow_square calls have started (the first wave is COUNT).
KILL_AFTER_STARTS = COUNT // 2
#: Bound on the client program; an undisturbed run takes about 4 s.
RUN_TIMEOUT = 60.0

#: How the SDK logs a request that failed with a server error (5xx).
SDK_SERVER_ERROR = re.compile(r"server error \(code=5\d\d\).*")


def expected(i: int) -> int:
    """What ``swarm(i)`` returns (see recovery.py)."""
    return swarm_value(i, FAN)


@pytest.fixture(scope="module")
def python_sdk() -> PythonSdk:
    """resonate-sdk 0.8.1 on Python 3.12, built on first use and cached."""
    return build_python_sdk()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A database of this test's own, dropped (connections and all) afterwards."""
    with throwaway_database("troth_cluster") as url:
        yield url


@dataclass
class Cluster:
    nodes: dict[str, Node]
    balancer: LoadBalancer


@pytest.fixture
def cluster(procs: Procs, postgres_url: str) -> Iterator[Cluster]:
    """n1, n2, n3 on one database, n1 and n2 behind a balancer; all three answer
    GET /ready.  The balancer's routes are printed with the logs of a failed test."""
    nodes = {name: Node(procs, name, postgres_url) for name in ("n1", "n2", "n3")}
    lb = LoadBalancer([nodes["n1"].port, nodes["n2"].port]).start()
    try:
        for node in nodes.values():
            # all three at once: migrations must tolerate that; what their execute
            # messages tell workers is the balancer's URL
            node.start("--server-url", lb.url, retry_timeout_ms=RETRY_TIMEOUT_MS)
        procs.wait_for(
            "every node to answer GET /ready", lambda: all(n.ready() for n in nodes.values()), 30
        )
        yield Cluster(nodes, lb)
    finally:
        lb.stop()
        print(lb.describe())


def started(workers: dict[str, Proc]) -> int:
    return sum(w.out().count("START slow_square") for w in workers.values())


def test_node_killed_mid_run(
    python_sdk: PythonSdk, postgres_url: str, procs: Procs, cluster: Cluster
) -> None:
    """SIGKILL a node mid-run: nothing is lost, no task version is granted twice."""
    t0 = time.monotonic()
    nodes, balancer = cluster.nodes, cluster.balancer
    n1, n2, n3 = nodes.values()
    by_port = {n.port: n for n in nodes.values()}

    # -- the workers, through the balancer -------------------------------------------
    workers: dict[str, Proc] = {}
    for name in WORKERS:
        argv = ["worker", "--url", balancer.url, "--name", name, "--log-sse"]
        argv += ["--ttl", str(WORKER_TTL_S), "--work", str(WORK_S)]
        workers[name] = procs.start(f"worker-{name}", python_sdk.program("recovery.py", *argv))
    pids = {}
    for name, w in workers.items():
        line = procs.wait_line(w, rf"^worker {name} ready pid=", 30)[0]
        pids[line.rsplit("pid=", 1)[1].strip()] = name

    def worker_streams() -> dict[str, int]:
        """Worker pid -> the port of the node holding its open SSE stream."""
        routes = balancer.polls("workers")
        return {r.first_line.split(" ")[1].split("/")[3]: r.backend for r in routes}

    procs.wait_for(
        "every worker's SSE stream to be open", lambda: set(worker_streams()) == set(pids), 30
    )

    # -- the client, on n3, and the kill ---------------------------------------------
    swarm = ["swarm", "--url", n3.url, "--suffix", "k", "--count", str(COUNT)]
    swarm += ["--fan", str(FAN), "--sleep", str(SLEEP_S), "--timeout", str(RUN_TIMEOUT)]
    client = procs.start("client", python_sdk.program("recovery.py", *swarm))
    run_started = time.monotonic()

    def client_failed() -> str | None:
        # The client runs with retry_policy=Never: a request answered 5xx (say the
        # task.create of r.run) loses its workflow, so the run can only time out.
        if m := SDK_SERVER_ERROR.search(client.err()):
            return f"the client got a server error, so a workflow is lost: {m[0]}"
        return None

    procs.sentinels.append(client_failed)

    def candidates() -> list[Node]:
        """n1/n2 that hold a worker stream and have granted a task, most streams first."""
        streams = Counter(worker_streams().values())
        found = [by_port[p] for p in streams if by_port[p].grants()]
        return sorted(found, key=lambda n: -streams[n.port])

    procs.wait_for(
        f"{KILL_AFTER_STARTS} slow_square calls to start, granted by a node holding a stream",
        lambda: started(workers) >= KILL_AFTER_STARTS and bool(candidates()),
        30,
    )
    victim = candidates()[0]
    survivor = n2 if victim is n1 else n1
    cut = sorted(pid for pid, port in worker_streams().items() if port == victim.port)
    killed_at = victim.kill_at()
    killed_mono = time.monotonic()
    claims_at_kill = unsettled_claims(postgres_url, victim.name)
    starts_at_kill = started(workers)
    grants_at_kill = len(victim.grants())
    print(
        f"killed {victim.name} {killed_mono - run_started:.2f} s into the run, holding the "
        f"streams of workers {[pids[p] for p in cut]}; {starts_at_kill} calls started, "
        f"{grants_at_kill} tasks granted by {victim.name}, {claims_at_kill} sends in flight on it"
    )

    # -- the workers it held reconnect to the survivor, through the balancer ---------
    def reconnected() -> bool:
        streams = worker_streams()
        if set(streams) != set(pids) or any(p != survivor.port for p in streams.values()):
            return False
        # The SDK itself saw its stream end and opened a new one (the process is the
        # same): it logs each stream it gets an answer on.
        return all(workers[pids[pid]].err().count("SSE connection established") >= 2 for pid in cut)

    procs.wait_for(
        f"every worker's stream to reopen on {survivor.name} (the SDK logging it)", reconnected, 30
    )
    reconnect_s = time.monotonic() - killed_mono
    procs.wait_for(
        f"{survivor.name} to count the workers' streams",
        lambda: survivor.sse_connections() == len(WORKERS),
        10,
    )

    # -- every workflow completes with the right value -------------------------------
    procs.wait_exit(client, RUN_TIMEOUT + 10)
    done_s = time.monotonic() - killed_mono
    lines = [x for x in client.out().splitlines() if x.startswith("swarm ")]
    assert lines == [f"swarm {i} -> {expected(i)}" for i in range(COUNT)], client.out()
    for i in range(COUNT):
        assert n3.promise_value(f"swarm-k-{i}") == ("resolved", expected(i))
    assert started(workers) > starts_at_kill, "nothing ran after the kill"

    # -- a survivor declared the killed node dead: presence gone, claims reaped -----
    def declared_dead() -> bool:
        return live_nodes(postgres_url) == {n.name for n in nodes.values() if n is not victim}

    procs.wait_for(f"a survivor to declare {victim.name} dead (node_timeout)", declared_dead, 20)
    holders = query(postgres_url, "SELECT node, grp, pid FROM connections ORDER BY 1, 2, 3")
    assert {(node, pid) for node, grp, pid in holders if grp == "workers"} == {
        (survivor.name, pid) for pid in pids
    }, holders
    procs.wait_for(
        f"{victim.name}'s outbox claims ({claims_at_kill} at the kill) to be reaped and settled",
        lambda: unsettled_claims(postgres_url, victim.name) == 0,
        10,
    )

    # -- no task version granted twice, across all nodes -----------------------------
    grants = [g for n in nodes.values() for g in n.grants()]
    assert (twice := granted_twice(grants)) is None, twice
    per_node = Counter(g.node for g in grants)
    after_kill = [g for g in grants if g.node != victim.name and g.at >= killed_at - 0.01]
    assert per_node[victim.name] == grants_at_kill >= 1, per_node
    assert after_kill, f"no survivor granted a task after the kill: {per_node}"

    # -- the survivors logged no error ------------------------------------------------
    problems = [p for n in nodes.values() if n is not victim for p in n.problems()]
    assert not problems, "surviving nodes logged errors:\n" + "\n".join(problems[:40])
    # -- each message went to the node holding its stream ---------------------------
    sends = {n.name: n.dispatch_outcomes() for n in nodes.values() if n is not victim}
    # n3 holds the client's stream alone: a send of its that did not complete is a
    # message for a worker that it claimed without holding the worker's stream.
    assert set(sends[n3.name]) == {"completed"}, sends
    print(
        f"sends by survivors {sends}\n"
        f"grants per node {dict(per_node)}; streams back on {survivor.name} after "
        f"{reconnect_s:.2f} s; all {COUNT} workflows done {done_s:.2f} s after the kill; "
        f"test took {time.monotonic() - t0:.1f} s"
    )
