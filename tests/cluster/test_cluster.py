"""Several troth nodes on one PostgreSQL database: cross-node delivery and death.

Two real servers (real sockets, real SSE) share one throwaway database.  A message
produced by a request served on one node must reach the worker connected to the
other, be claimed by the node that holds the connection, and wake it by NOTIFY
(not by its 1 s maintenance sweep).  A node whose heartbeat stopped loses its
presence and its claims.  The SDK-level test with a SIGKILLed node is
``test_cluster_sdk.py``.
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from helpers.pg import throwaway_database
from helpers.pgbouncer import needs_pgbouncer, pgbouncer
from helpers.sse import stream
from helpers.support import RunningServer, running_server
from troth.outbox import codes
from troth.server.config import Settings
from troth.server.delivery.cluster import Cluster
from troth.store.postgres import PostgresStore

FAR = 10**13


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with throwaway_database("troth_cluster") as u:
        PostgresStore(u).close()  # create the schema
        yield u


@pytest.fixture(
    scope="module",
    params=["direct", pytest.param("pgbouncer-transaction", marks=needs_pgbouncer)],
)
def base(url: str, request: pytest.FixtureRequest) -> Iterator[Settings]:
    """The nodes' settings: on the database directly, or through PgBouncer in
    transaction mode with LISTEN on a direct connection (``url`` stays direct: the
    tests read the database with it)."""
    settings = Settings(
        store="postgres", postgres_url=url, debug=True, access_log=False, keepalive=0.2
    )
    if request.param == "direct":
        yield settings
        return
    with pgbouncer("transaction", pool_size=10) as bouncer:
        yield replace(
            settings,
            postgres_url=bouncer.url(url),
            postgres_pool_mode="transaction",
            postgres_listen_url=url,
        )


@pytest.fixture
def nodes(url: str, base: Settings) -> Iterator[tuple[RunningServer, RunningServer]]:
    """Nodes ``a`` and ``b`` on one emptied database, loops running."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE promises, tasks, schedules, outbox, nodes, connections")
    with (
        running_server(replace(base, node_id="a")) as a,
        running_server(replace(base, node_id="b")) as b,
    ):
        for n in (a, b):
            n.ok("debug.stop", {})  # debug servers start paused: run timer and delivery
        yield a, b


def cluster(node: RunningServer) -> Cluster:
    c = node.app.cluster
    assert c is not None
    return c


def wait_for(what: str, check: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def outbox_row(url: str, key: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        cur = conn.execute(
            "SELECT state, claimed_by, last_code, attempts FROM outbox WHERE key = %s"
            " ORDER BY id DESC LIMIT 1",
            (key,),
        )
        row = cur.fetchone()
    assert row is not None, key
    return {"state": row[0], "claimed_by": row[1], "last_code": row[2], "attempts": row[3]}


def create(node: RunningServer, id: str, target: str) -> None:
    node.ok("promise.create", {"id": id, "timeoutAt": FAR, "tags": {"resonate:target": target}})


def published(url: str) -> set[tuple[str, str, str]]:
    with psycopg.connect(url) as conn:
        return {
            (r[0], r[1], r[2])
            for r in conn.execute("SELECT node, grp, pid FROM connections").fetchall()
        }


def test_nodes_register_and_publish_their_connections(
    nodes: tuple[RunningServer, RunningServer], url: str
) -> None:
    _, b = nodes
    with psycopg.connect(url) as conn:
        names = {r[0] for r in conn.execute("SELECT node FROM nodes").fetchall()}
    assert names == {"a", "b"}
    with stream(b, "G", "w1"):
        # Published before the stream's first byte: no wait needed.
        assert ("b", "g", "w1") in published(url)
    wait_for("the connection to be withdrawn", lambda: ("b", "g", "w1") not in published(url))


def test_unicast_is_delivered_by_the_node_holding_the_connection(
    nodes: tuple[RunningServer, RunningServer], url: str
) -> None:
    a, b = nodes
    heard_before = cluster(b).heard
    with stream(b, "g", "w1") as w1:
        create(a, "t1", "poll://uni@g/w1")
        message = w1.next(timeout=5)
    assert message["data"]["task"] == {"id": "t1", "version": 0}
    row = wait_for(
        "t1 completed", lambda: (r := outbox_row(url, "t1"))["state"] == "completed" and r
    )
    assert row["claimed_by"] == "b"
    assert row["attempts"] == 0  # claimed by b at once, never tried by a
    assert cluster(b).heard > heard_before  # a's commit was announced to b
    metrics = b.client.get("/metrics").text
    assert f"troth_cluster_notifications_heard {cluster(b).heard}" in metrics


def test_anycast_goes_to_the_preferred_id_then_to_any_node_with_the_group(
    nodes: tuple[RunningServer, RunningServer], url: str
) -> None:
    a, b = nodes
    with stream(a, "g", "on-a") as on_a, stream(b, "g", "on-b") as on_b:
        for i in range(5):
            create(a, f"pref-b-{i}", "poll://any@g/on-b")
            assert on_b.next()["data"]["task"]["id"] == f"pref-b-{i}"
            create(b, f"pref-a-{i}", "poll://any@g/on-a")
            assert on_a.next()["data"]["task"]["id"] == f"pref-a-{i}"
        for s in (on_a, on_b):
            with pytest.raises(queue.Empty):
                s.next(timeout=0.2)
        assert outbox_row(url, "pref-b-0")["claimed_by"] == "b"
        assert outbox_row(url, "pref-a-0")["claimed_by"] == "a"
    with stream(b, "h", "only-b") as only_b:
        create(a, "any-h", "poll://any@h")
        assert only_b.next()["data"]["task"]["id"] == "any-h"
        create(a, "any-h-gone", "poll://any@h/gone")
        assert only_b.next()["data"]["task"]["id"] == "any-h-gone"
    assert outbox_row(url, "any-h")["claimed_by"] == "b"


def test_unblock_crosses_nodes(nodes: tuple[RunningServer, RunningServer], url: str) -> None:
    a, b = nodes
    with stream(a, "g", "listener") as listener:
        b.ok("promise.create", {"id": "p", "timeoutAt": FAR, "tags": {"resonate:external": "true"}})
        b.ok("promise.register_listener", {"awaited": "p", "address": "poll://uni@g/listener"})
        b.ok("promise.settle", {"id": "p", "state": "resolved", "value": {"data": "eA=="}})
        message = listener.next()
    assert message["kind"] == "unblock"
    assert message["data"]["promise"]["id"] == "p"


def test_a_message_nobody_can_take_waits_and_reaches_a_late_worker_on_another_node(
    nodes: tuple[RunningServer, RunningServer], url: str
) -> None:
    a, b = nodes
    create(a, "late", "poll://uni@g/late")
    wait_for("a first attempt", lambda: outbox_row(url, "late")["attempts"] >= 1)
    assert outbox_row(url, "late")["last_code"] == codes.NO_CONNECTION
    with stream(b, "g", "late") as s:
        assert s.next(timeout=8)["data"]["task"]["id"] == "late"
    assert wait_for("late completed", lambda: outbox_row(url, "late")["state"] == "completed")
    assert outbox_row(url, "late")["claimed_by"] == "b"


def test_a_deadline_armed_on_one_node_wakes_the_other_nodes_timer(
    nodes: tuple[RunningServer, RunningServer],
) -> None:
    a, b = nodes
    # A node announces a deadline earlier than the one its own timer sleeps until:
    # with b's timer paused, that is every deadline b arms.
    b.ok("debug.start", {})
    wait_for("b's timer to be paused", lambda: b.app.engine._target == math.inf)
    # What reaches a's timer: b's announcement, not a read of a's own (a timer of a
    # shared store reads only the next few seconds, every 5 s: it would not see a
    # deadline ten minutes ahead).
    learnt: list[float] = []
    poke = a.app.engine._poke

    def spy(instant: float) -> None:
        learnt.append(instant)
        poke(instant)

    a.app.engine._poke = spy  # type: ignore[method-assign]
    deadline = int(time.time() * 1000) + 600_000
    b.ok(
        "promise.create", {"id": "timer", "timeoutAt": deadline, "tags": {"resonate:timer": "true"}}
    )
    # Under a loaded machine the announcement may take more than the 3 s once allowed.
    wait_for("a's timer to learn the deadline", lambda: deadline in learnt, timeout=10)
    wait_for("a to have heard b's deadline", lambda: cluster(a).deadlines_heard >= 1)


def test_a_dead_nodes_presence_stops_counting_and_its_claims_are_reaped(
    nodes: tuple[RunningServer, RunningServer], url: str
) -> None:
    a, b = nodes
    # A node that stopped heartbeating 60 s ago, holding a connection and a claim.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO nodes (node, url, started_at, seen_at) VALUES ('ghost', 'x', 0,"
            " extract(epoch FROM clock_timestamp()) * 1000 - 60000)"
        )
        conn.execute("INSERT INTO connections VALUES ('ghost', 'g', 'haunted')")
    # Its connection does not count: a message for it is tried (and backed off) at once.
    create(a, "haunt", "poll://uni@g/haunted")
    wait_for("an attempt", lambda: outbox_row(url, "haunt")["attempts"] >= 1)
    with psycopg.connect(url, autocommit=True) as conn:
        # Claimed just now: the claim-timeout reaper (claims older than 120 s) must not
        # be the one that frees it; only the ghost's death may.
        conn.execute(
            "UPDATE outbox SET state = 'dispatching', claim_token = 'tok', claimed_by = 'ghost',"
            " claimed_at = round(extract(epoch FROM clock_timestamp()) * 1000)"
            " WHERE key = 'haunt'"
        )
    # Well within the 120 s claim timeout, and not the 5 s of a quick state change: the
    # reaper runs at the nodes' heartbeat, which a busy machine delays.
    wait_for(
        "the ghost's claim to be reaped",
        lambda: outbox_row(url, "haunt")["state"] != "dispatching",
        timeout=30,
    )
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM nodes WHERE node = 'ghost'").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM connections WHERE node = 'ghost'").fetchone() == (
            0,
        )
    assert cluster(a).reaped + cluster(b).reaped == 1
    # Reaped as outcome_unknown, then reconciled: the task is still pending at version
    # 0, so the message goes back to pending to be sent again.
    row = wait_for("a resend", lambda: (r := outbox_row(url, "haunt"))["state"] == "pending" and r)
    assert row["attempts"] >= 1


def test_a_live_node_still_holding_a_connection_is_preferred_over_the_fallback(
    nodes: tuple[RunningServer, RunningServer], url: str
) -> None:
    """b holds w; a holds nothing of group g: a must never claim the row, however
    often it sweeps (it is woken by the same NOTIFY as b)."""
    a, b = nodes
    with stream(b, "g", "w") as w:
        for i in range(10):
            create(a, f"m{i}", "poll://uni@g/w")
        got = sorted(w.next()["data"]["task"]["id"] for _ in range(10))
    assert got == sorted(f"m{i}" for i in range(10))
    for i in range(10):
        assert outbox_row(url, f"m{i}")["claimed_by"] == "b"


def test_a_node_leaving_deregisters(url: str, base: Settings) -> None:
    with running_server(replace(base, node_id="leaver")), psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM nodes WHERE node = 'leaver'").fetchone() == (1,)
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM nodes WHERE node = 'leaver'").fetchone() == (0,)


def test_any_node_explains_with_the_whole_clusters_connections(
    nodes: tuple[RunningServer, RunningServer], url: str
) -> None:
    """Asked on node a, explain and /ops/workers see the worker connected to node b."""
    a, b = nodes
    a.ok("debug.start", {})  # paused: the execute stays put, the lease is taken by hand
    create(a, "held", "poll://any@hq")
    with stream(b, "HQ", "w1"):
        workers = a.client.get("/ops/workers").json()
        group = next(g for g in workers["groups"] if g["group"] == "hq")
        assert [(c["pid"], c["node"]) for c in group["connections"]] == [("w1", "b")]
        assert {n["node"] for n in workers["nodes"]} == {"a", "b"}
        a.ok("task.acquire", {"id": "held", "version": 0, "pid": "w1", "ttl": 60_000})
        root = a.client.get("/ops/explain", params={"id": "held"}).json()["root"]
        assert root["reason"] == "held" and root["evidence"]["nodes"] == ["b"]
        assert "task held by pid `w1` on node `b`, lease expires in" in root["text"]
    # Gone from b: any node says when the group was last seen (worker_groups).
    wait_for("the connection to be withdrawn", lambda: ("b", "hq", "w1") not in published(url))
    a.ok("task.release", {"id": "held", "version": 1})
    root = a.client.get("/ops/explain", params={"id": "held"}).json()["root"]
    assert root["reason"] == "no_worker" and "(last seen " in root["text"], root
