"""A PostgreSQL failover under two troth nodes, SDK workflows and raw requests.

A primary and a streaming standby of the test's own (``pg_createcluster`` on free
ports, ``pg_basebackup -R``), the standby synchronous (``synchronous_standby_names``:
a commit returns once the standby has it).  Two ``troth serve`` nodes reach them by
the multi-host URL with ``target_session_attrs=read-write`` (docs/operations.md,
"Failover"); the real Python SDK's workers hold their streams on ``n1``, its
client runs ``swarm`` workflows on ``n2``, and a thread sends raw
create-and-resolve lifecycles to both nodes.  Mid-run the primary is stopped hard
(``-m immediate``) and the standby promoted.

Then: every workflow returns the right value, and the last one soon after the
promotion (requests that met the switch waited for it, ``postgres_outage_wait``,
rather than failing); every create and resolve answered 200 is in the promoted
database; no ``(task, version)`` was granted twice; no node answered 500 or logged
an error.  A 503 is allowed only for a request whose COMMIT the crash cut off (its
outcome unknown): the test counts and prints them.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from helpers.cluster import Node, granted_twice, swarm_value
from helpers.pgcluster import PgCluster, ctl, needs_pg_createcluster, standby_of, throwaway_cluster
from helpers.sdk_env import Procs, PythonSdk, build_python_sdk
from helpers.support import VERSION

pytestmark = [pytest.mark.timeout(240), needs_pg_createcluster]

HBA = (
    "local all postgres peer\n"
    "host all all 127.0.0.1/32 trust\n"
    "host replication all 127.0.0.1/32 trust\n"
)
COUNT = 8
FAN = 2
RUN_TIMEOUT = 90.0
#: Seconds from the promotion to the last workflow's end that count as "soon".
SOON = 15.0
FAR = 10**13
STATUS = re.compile(r"troth\.access \S+ corrId=\S+ status=(\d+)")


@pytest.fixture(scope="module")
def python_sdk() -> PythonSdk:
    return build_python_sdk()


@pytest.fixture
def pair() -> Iterator[tuple[PgCluster, PgCluster]]:
    with (
        throwaway_cluster({"synchronous_standby_names": "'standby'"}, HBA) as primary,
        standby_of(primary, {}, HBA) as standby,
    ):
        deadline = time.monotonic() + 30
        with psycopg.connect(primary.url(), autocommit=True) as conn:
            while True:
                rows = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'"
                ).fetchall()
                if rows == [("sync",)]:
                    break
                assert time.monotonic() < deadline, f"standby not synchronous: {rows}"
                time.sleep(0.1)
            conn.execute("CREATE DATABASE troth")
        yield primary, standby


@pytest.fixture
def postgres_url(pair: tuple[PgCluster, PgCluster]) -> str:
    primary, standby = pair
    hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
    return f"postgresql://postgres@{hosts}/troth?target_session_attrs=read-write&connect_timeout=2"


class Lifecycles:
    """Raw create-then-resolve lifecycles on both nodes, from a thread; what each
    answered."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.created: set[str] = set()
        self.resolved: set[str] = set()
        self.statuses: list[int] = []
        #: The messages of the 503s: an unknown outcome (a COMMIT the crash cut off)
        #: is allowed, a refusal for want of a database is not (it should have waited).
        self.unavailable: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def call(self, client: httpx.Client, kind: str, data: Any, i: int) -> int:
        envelope = {"kind": kind, "head": {"corrId": f"l{i}", "version": VERSION}, "data": data}
        try:
            reply = client.post("/", json=envelope)
            status = reply.status_code
            if status == 503:
                self.unavailable.append(str(reply.json()["data"]))
        except httpx.HTTPError:
            status = 0
        self.statuses.append(status)
        return status

    def run(self) -> None:
        clients = [httpx.Client(base_url=n.url, timeout=30) for n in self.nodes]
        i = 0
        try:
            while not self.stop.is_set():
                client = clients[i % len(clients)]
                id = f"life-{i}"
                if self.call(client, "promise.create", {"id": id, "timeoutAt": FAR}, i) == 200:
                    self.created.add(id)
                    resolve = {"id": id, "state": "resolved", "value": {"data": "eA=="}}
                    if self.call(client, "promise.settle", resolve, i) == 200:
                        self.resolved.add(id)
                i += 1
                time.sleep(0.01)
        finally:
            for c in clients:
                c.close()


def test_failover_mid_run_loses_nothing_and_costs_seconds(
    python_sdk: PythonSdk, postgres_url: str, pair: tuple[PgCluster, PgCluster], procs: Procs
) -> None:
    primary, standby = pair
    nodes = [Node(procs, name, postgres_url) for name in ("n1", "n2")]
    for node in nodes:
        node.start(retry_timeout_ms=1000)
    procs.wait_for("both nodes to answer GET /ready", lambda: all(n.ready() for n in nodes), 30)
    n1, n2 = nodes

    workers = []
    for name in ("A", "B"):
        argv = ["worker", "--url", n1.url, "--name", name, "--ttl", "10", "--work", "0.5"]
        workers.append(procs.start(f"worker-{name}", python_sdk.program("recovery.py", *argv)))
    for name, w in zip(("A", "B"), workers, strict=True):
        procs.wait_line(w, rf"^worker {name} ready pid=", 30)
    procs.wait_for("both workers' streams on n1", lambda: n1.sse_connections() == 2, 30)

    lifecycles = Lifecycles(nodes)
    lifecycles.thread.start()
    swarm = ["swarm", "--url", n2.url, "--suffix", "fo", "--count", str(COUNT)]
    swarm += ["--fan", str(FAN), "--sleep", "1", "--timeout", str(RUN_TIMEOUT)]
    client = procs.start("client", python_sdk.program("recovery.py", *swarm))
    try:
        procs.wait_for(
            "workflows under way",
            lambda: sum(w.out().count("START slow_square") for w in workers) >= COUNT // 2,
            30,
        )
        ctl(primary, "stop", "-m", "immediate")  # the primary crashes
        # a request sent while no database takes writes: it waits for the promotion
        during: list[int] = []
        sender = threading.Thread(
            target=lambda: during.append(
                httpx.post(
                    n1.url,
                    json={
                        "kind": "promise.create",
                        "head": {"corrId": "during", "version": VERSION},
                        "data": {"id": "during", "timeoutAt": FAR},
                    },
                    timeout=30,
                ).status_code
            )
        )
        sender.start()
        time.sleep(1.0)
        ctl(standby, "promote")
        promoted = time.monotonic()
        sender.join(30)
        assert during == [200], f"a request during the switch was answered {during}"
        procs.wait_exit(client, RUN_TIMEOUT + 10)
        finished = time.monotonic() - promoted
        time.sleep(1.0)  # raw lifecycles after the switch too
    finally:
        lifecycles.stop.set()
        lifecycles.thread.join(40)

    lines = [x for x in client.out().splitlines() if x.startswith("swarm ")]
    assert lines == [f"swarm {i} -> {swarm_value(i, FAN)}" for i in range(COUNT)], client.out()
    with psycopg.connect(standby.url("troth")) as conn:
        rows = conn.execute("SELECT id, state FROM promises WHERE id LIKE 'life-%'").fetchall()
    stored = dict(rows)
    assert lifecycles.created <= set(stored), sorted(lifecycles.created - set(stored))[:10]
    assert all(stored[id] == "resolved" for id in lifecycles.resolved)

    grants = [g for n in nodes for g in n.grants()]
    assert (twice := granted_twice(grants)) is None, twice
    statuses = [int(m[1]) for n in nodes for m in STATUS.finditer(n.proc.err() if n.proc else "")]
    answered = lifecycles.statuses
    print(
        f"failover: last workflow {finished:.1f} s after the promotion; "
        f"{len(lifecycles.created)} raw creates acknowledged, "
        f"503s: {statuses.count(503)} in the nodes' logs, {answered.count(503)} raw"
    )
    assert 500 not in statuses and 500 not in answered
    assert 0 not in answered, "a request failed without an answer"
    refused = [m for m in lifecycles.unavailable if "outcome is unknown" not in m]
    assert not refused, f"requests refused instead of waiting for the database: {refused}"
    errors = [
        p for n in nodes for p in n.problems() if "status=503" not in p
    ]  # a 503 is allowed (an interrupted COMMIT); anything else is not
    assert not errors, "the nodes logged errors:\n" + "\n".join(errors[:40])
    assert finished < SOON, f"the last workflow ended {finished:.1f} s after the promotion"
