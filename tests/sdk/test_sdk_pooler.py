"""Two troth nodes behind PgBouncer in transaction mode, and the real Python SDK.

What the pooler changes: one client connection's transactions run on whichever
server connection is free, so nothing may be left on a server session between them
(``postgres_pool_mode = transaction``: no prepared statement, settings per
transaction), and LISTEN, which needs a session, goes to a direct connection
(``postgres_listen_url``).  Both nodes (``troth serve`` processes) reach the
database through one PgBouncer with a pool smaller than the nodes' connections, so
server connections are shared between them; the workers hold their streams on
``n1``, the client talks to ``n2``, so every rpc and every result crosses nodes.

Every workflow must return the right value, no ``(task, version)`` may be granted
twice, and neither node may log an error or answer 5xx.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helpers.cluster import Node, granted_twice, swarm_value
from helpers.pg import throwaway_database
from helpers.pgbouncer import Bouncer, needs_pgbouncer, pgbouncer
from helpers.sdk_env import Procs, PythonSdk, build_python_sdk

pytestmark = [pytest.mark.timeout(120), needs_pgbouncer]

COUNT = 8
FAN = 2
RUN_TIMEOUT = 45.0


@pytest.fixture(scope="module")
def python_sdk() -> PythonSdk:
    return build_python_sdk()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    with throwaway_database("troth_pooled") as url:
        yield url


@pytest.fixture
def bouncer(postgres_url: str) -> Iterator[Bouncer]:
    # Fewer server connections than the two nodes hold: they must share them.
    with pgbouncer("transaction", pool_size=4) as b:
        yield b


def test_two_nodes_through_pgbouncer_in_transaction_mode(
    python_sdk: PythonSdk, postgres_url: str, bouncer: Bouncer, procs: Procs
) -> None:
    nodes = [Node(procs, name, bouncer.url(postgres_url)) for name in ("n1", "n2")]
    for node in nodes:
        node.start(
            *["--postgres-pool-mode", "transaction", "--postgres-listen-url", postgres_url],
            retry_timeout_ms=1000,
        )
    procs.wait_for("both nodes to answer GET /ready", lambda: all(n.ready() for n in nodes), 30)
    n1, n2 = nodes

    workers = []
    for name in ("A", "B"):
        argv = ["worker", "--url", n1.url, "--name", name, "--ttl", "5", "--work", "0.2"]
        workers.append(procs.start(f"worker-{name}", python_sdk.program("recovery.py", *argv)))
    for name, w in zip(("A", "B"), workers, strict=True):
        procs.wait_line(w, rf"^worker {name} ready pid=", 30)
    procs.wait_for("both workers' streams on n1", lambda: n1.sse_connections() == 2, 30)

    swarm = ["swarm", "--url", n2.url, "--suffix", "pool", "--count", str(COUNT)]
    swarm += ["--fan", str(FAN), "--sleep", "0.5", "--timeout", str(RUN_TIMEOUT)]
    client = procs.start("client", python_sdk.program("recovery.py", *swarm))
    procs.wait_exit(client, RUN_TIMEOUT + 10)

    lines = [x for x in client.out().splitlines() if x.startswith("swarm ")]
    assert lines == [f"swarm {i} -> {swarm_value(i, FAN)}" for i in range(COUNT)], client.out()
    for i in range(COUNT):
        assert n2.promise_value(f"swarm-pool-{i}") == ("resolved", swarm_value(i, FAN))
    grants = [g for n in nodes for g in n.grants()]
    assert grants, "no task was granted"
    assert (twice := granted_twice(grants)) is None, twice
    problems = [p for n in nodes for p in n.problems()]
    assert not problems, "the nodes logged errors:\n" + "\n".join(problems[:40])
