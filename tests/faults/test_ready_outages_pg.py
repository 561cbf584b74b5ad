"""A running node behind PgBouncer whose pooler, then whose database, goes away.

``troth serve`` (a real process) on a PostgreSQL cluster of the test's own, reached
through a real PgBouncer in transaction mode (``postgres_pool_mode = transaction``,
``postgres_listen_url`` the database itself).  Under it, while requests keep coming
(a write, ``/ready`` and ``/health``, each every quarter second, from threads of
their own):

* the pooler is killed (SIGKILL), then started again on the same port;
* the database is stopped (``pg_ctlcluster … stop -m fast``), then started again.

During each outage ``/ready`` answers 503 with a reason and an error within a few
seconds, ``/health`` stays 200, writes answer 503 (never 500) and none takes longer
than :data:`LIMIT_S`; after it ``/ready`` is 200 again within :data:`BACK_S` and
writes succeed; every write answered 200, before, during or after, is stored.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from helpers.cluster import Node, query
from helpers.pgbouncer import Bouncer, needs_pgbouncer, pgbouncer
from helpers.pgcluster import PgCluster, ctl, needs_pg_createcluster, throwaway_cluster
from helpers.probes import Probes
from helpers.sdk_env import Procs, children_of_test
from helpers.support import VERSION

pytestmark = [needs_pgbouncer, needs_pg_createcluster, pytest.mark.timeout(180)]

#: Longest any request may take during an outage: the engine's deadline (5 s,
#: ``engine/base.py``) and slack for a loaded machine.
LIMIT_S = 7.5
#: How soon ``/ready`` must say 503 once the outage begins, and 200 once it ends.
NOTICED_S = 6.0
BACK_S = 10.0
#: How long each outage lasts.
OUTAGE_S = 8.0
HBA = "local all all trust\nhost all all 127.0.0.1/32 trust\n"


@dataclass
class Answer:
    at: float  # monotonic, when sent
    what: str  # the promise id of a write; "ready" or "health"
    status: int  # 0: no answer at all
    seconds: float
    data: Any


def probe(node: Node, what: str, i: int) -> Answer:
    """One timed request (never raises: no answer is status 0): a write of a promise
    of its own, or GET ``/ready`` or ``/health``."""
    sent = time.monotonic()
    try:
        if what == "write":
            id = f"w-{i}"
            data = {"id": id, "timeoutAt": 10**13, "tags": {}}
            envelope = {
                "kind": "promise.create",
                "head": {"corrId": id, "version": VERSION},
                "data": data,
            }
            r = httpx.post(f"{node.url}/", json=envelope, timeout=3 * LIMIT_S)
            body = r.json()
            status, payload = int(body["head"]["status"]), body["data"]
            what = id
        else:
            r = httpx.get(f"{node.url}/{what}", timeout=3 * LIMIT_S)
            status, payload = r.status_code, r.json()
    except (httpx.HTTPError, ValueError) as exc:
        status, payload = 0, repr(exc)
    return Answer(sent, what, status, time.monotonic() - sent, payload)


def probes(node: Node) -> Probes[Answer]:
    """A write, ``/ready`` and ``/health`` against the node, each every quarter
    second, until the block ends."""
    kinds = ("write", "ready", "health")
    return Probes(
        {w: functools.partial(probe, node, w) for w in kinds}, every=0.25, join=3 * LIMIT_S
    )


def since(answers: list[Answer], start: float, what: str) -> list[Answer]:
    return [a for a in answers if a.at >= start and a.what.startswith(what)]


@dataclass
class Setup:
    cluster: PgCluster
    direct: str
    bouncer: Bouncer
    node: Node
    procs: Procs


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    """The cluster, the pooler in front of it, and the node, ready."""
    with (
        throwaway_cluster({}, HBA) as cluster,
        pgbouncer("transaction", pool_size=4, upstream_url=cluster.url()) as bouncer,
        children_of_test(tmp_path) as procs,
    ):
        with psycopg.connect(cluster.url(), autocommit=True, connect_timeout=5) as conn:
            conn.execute("CREATE DATABASE troth")
        direct = cluster.url("troth")
        node = Node(procs, "n1", bouncer.url(direct))
        node.start("--postgres-pool-mode", "transaction", "--postgres-listen-url", direct)
        procs.wait_for("the node to answer GET /ready", node.ready, 30)
        yield Setup(cluster, direct, bouncer, node, procs)


def outage(s: Setup, stop: Callable[[], None], start: Callable[[], None]) -> None:
    """``stop`` under the running node for :data:`OUTAGE_S`, then ``start``; what
    the node answered meanwhile and afterwards, checked."""
    node, procs = s.node, s.procs
    assert node.call("promise.create", {"id": "before", "timeoutAt": 10**13, "tags": {}})[0] == 200
    with probes(node) as prober:
        time.sleep(1)
        began = time.monotonic()
        stop()
        procs.wait_for(
            "/ready to answer 503",
            lambda: any(a.status == 503 for a in since(prober.answers, began, "ready")),
            NOTICED_S + LIMIT_S,
        )
        noticed = min(
            a.at + a.seconds - began
            for a in since(prober.answers, began, "ready")
            if a.status == 503
        )
        time.sleep(max(OUTAGE_S - (time.monotonic() - began), 0))
        ended = time.monotonic()
        start()
        restarted = time.monotonic()
        procs.wait_for("/ready to answer 200 again", node.ready, BACK_S)
        back = time.monotonic() - restarted
        time.sleep(1)
    answers = prober.answers
    during = [a for a in answers if began <= a.at < ended]

    slow = [a for a in answers if a.status == 0 or a.seconds > LIMIT_S]
    assert not slow, f"answered late or never: {slow}"
    assert noticed <= NOTICED_S, f"/ready said 503 only {noticed:.1f} s into the outage"
    not_ready = [a for a in during if a.what == "ready" and a.status == 503]
    assert all(a.data["reason"] and a.data["error"] for a in not_ready), not_ready
    assert all(a.status == 200 for a in answers if a.what == "health"), "/health was not 200"
    writes = [a for a in answers if a.what.startswith("w-")]
    assert not [a for a in writes if a.status not in (200, 503)], writes
    refused = [a for a in during if a.what.startswith("w-") and a.status == 503]
    assert refused, f"no write answered 503 during the outage: {during}"
    assert node.call("promise.create", {"id": "after", "timeoutAt": 10**13, "tags": {}})[0] == 200
    late = [a for a in writes if a.at >= restarted + back]
    assert late and all(a.status == 200 for a in late), late

    acknowledged = {a.what for a in writes if a.status == 200} | {"before", "after"}
    stored = {row[0] for row in query(s.direct, "SELECT id FROM promises")}
    assert not acknowledged - stored, f"acknowledged and lost: {acknowledged - stored}"
    assert node.proc is not None and "status=500" not in node.proc.err()
    print(
        f"{len(answers)} requests, {len(refused)} writes refused; /ready 503 after"
        f" {noticed:.1f} s, 200 {back:.1f} s after the restart;"
        f" slowest {max(a.seconds for a in answers):.2f} s"
    )


def test_the_pooler_stopped_under_a_running_node(setup: Setup) -> None:
    outage(setup, setup.bouncer.kill, setup.bouncer.restart)


def test_the_database_stopped_under_a_running_node(setup: Setup) -> None:
    outage(
        setup,
        lambda: ctl(setup.cluster, "stop", "-m", "fast"),
        lambda: ctl(setup.cluster, "start"),
    )
