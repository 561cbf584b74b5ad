"""No message is stranded: what no node could deliver is offered again when a node
publishes its stream (``server/delivery/cluster.py``, "No message is stranded").

Two real servers on one throwaway database, real SSE streams.  A message for a
stream nobody holds is tried and backed off (``troth.poll.no_connection``), and
after its attempts fails (``troth.dispatch.attempts_exhausted``: rewritten here
rather than waited for, 81 s of back-off).  Either way it must reach the stream as
soon as a node publishes it: a worker connecting, or a node that its peers took
for dead (its ``nodes`` row removed, as the reaper does) re-registering with its
next heartbeat and republishing the streams it still holds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import psycopg
import pytest

from helpers.pg import throwaway_database
from helpers.sse import stream
from helpers.support import RunningServer, running_server, wait_for
from troth.outbox import codes
from troth.server.config import Settings
from troth.store.postgres import PostgresStore

pytestmark = pytest.mark.timeout(60)

FAR = 10**13


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with throwaway_database("troth_stranded") as u:
        PostgresStore(u).close()  # create the schema
        yield u


@pytest.fixture
def nodes(url: str) -> Iterator[tuple[RunningServer, RunningServer]]:
    base = Settings(store="postgres", postgres_url=url, debug=True, access_log=False, keepalive=0.2)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE promises, tasks, schedules, outbox, nodes, connections")
    with (
        running_server(replace(base, node_id="a")) as a,
        running_server(replace(base, node_id="b")) as b,
    ):
        for n in (a, b):
            n.ok("debug.stop", {})  # debug servers start paused: run timer and delivery
        yield a, b


def sql(url: str, statement: str, *args: object) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, args)
        return cur.fetchall() if cur.description else []


def rows(url: str, key: str) -> list[tuple[object, ...]]:
    """``(state, last_code, attempts)`` of every row of ``key``, oldest first."""
    return sql(url, "SELECT state, last_code, attempts FROM outbox WHERE key = %s ORDER BY id", key)


def unreachable(node: RunningServer, url: str, id: str, address: str) -> str:
    """A message (an execute of promise ``id``) for ``address``, tried once and backed
    off for want of a connection; its key."""
    node.ok("promise.create", {"id": id, "timeoutAt": FAR, "tags": {"resonate:target": address}})
    (key,) = sql(url, "SELECT key FROM outbox WHERE task_id = %s", id)[0]
    assert isinstance(key, str)
    wait_for("a first attempt", lambda: rows(url, key)[-1][1] == codes.NO_CONNECTION)
    return key


def exhaust(url: str, key: str) -> None:
    """What its last attempt would have made of it (81 s of back-off later)."""
    sql(
        url,
        "UPDATE outbox SET state = 'failed', attempts = 5, last_code = %s WHERE key = %s",
        codes.ATTEMPTS_EXHAUSTED,
        key,
    )


def test_a_backed_off_message_goes_out_as_soon_as_its_worker_connects(
    nodes: tuple[RunningServer, RunningServer], url: str
) -> None:
    a, b = nodes
    unreachable(a, url, "held", "poll://uni@g/w1")
    # Backed off 1 s, then 4 s: the connection is what brings it, not the clock.
    sql(url, "UPDATE outbox SET available_at = available_at + 600000 WHERE task_id = 'held'")
    with stream(b, "g", "w1") as w1:
        assert w1.next(timeout=3)["data"]["task"]["id"] == "held"


def test_a_failed_message_is_offered_again_when_its_stream_is_published(
    nodes: tuple[RunningServer, RunningServer], url: str
) -> None:
    a, b = nodes
    key = unreachable(a, url, "gave-up", "poll://uni@g/w2")
    exhaust(url, key)
    other = unreachable(a, url, "other", "poll://uni@g/someone-else")
    exhaust(url, other)
    with stream(b, "g", "w2") as w2:
        assert w2.next(timeout=3)["data"]["task"]["id"] == "gave-up"
    wait_for("its row completed", lambda: rows(url, key)[-1][0] == "completed")
    assert rows(url, key)[-1][2] == 0  # its attempts start over
    # Exactly that stream's: a message for another id stays failed.
    assert rows(url, other) == [("failed", codes.ATTEMPTS_EXHAUSTED, 5)]


def test_a_node_taken_for_dead_republishes_and_gets_what_failed_meanwhile(
    nodes: tuple[RunningServer, RunningServer], url: str
) -> None:
    a, b = nodes
    with stream(b, "g", "w3") as w3:
        # b is cut off: it claims nothing (paused), and its peers took it for dead
        # (its presence removed, as the reaper does), so a tries the message itself.
        b.ok("debug.start", {})
        # Right after a heartbeat of b's (one a second): the next one, which finds it
        # was taken for dead, comes after the message failed.
        seen = sql(url, "SELECT seen_at FROM nodes WHERE node = 'b'")
        wait_for(
            "a heartbeat", lambda: sql(url, "SELECT seen_at FROM nodes WHERE node = 'b'") != seen
        )
        sql(url, "DELETE FROM nodes WHERE node = 'b'")
        key = unreachable(a, url, "meanwhile", "poll://uni@g/w3")
        exhaust(url, key)
        b.ok("debug.stop", {})
        # b's next heartbeat (every node_timeout / 5 = 1 s) finds it was taken for
        # dead, registers again and republishes w3: the message is offered again.
        assert w3.next(timeout=5)["data"]["task"]["id"] == "meanwhile"
    assert sql(url, "SELECT count(*) FROM nodes WHERE node = 'b'") == [(1,)]


@pytest.mark.parametrize(
    ("newer", "worker"),
    [("pending", "w4"), ("completed", "w6")],
    ids=["newer-pending", "newer-already-sent"],
)
def test_a_failed_message_with_a_newer_one_of_its_key_stays_failed(
    nodes: tuple[RunningServer, RunningServer], url: str, newer: str, worker: str
) -> None:
    """A newer message of the same key — pending (held far back so that nothing
    sends it before the stream opens), or an execute of the same task already
    delivered — is the one that counts: the failed one is not offered again."""
    a, b = nodes
    key = unreachable(a, url, f"older-{newer}", f"poll://uni@g/{worker}")
    exhaust(url, key)
    sql(
        url,
        "INSERT INTO outbox (key, address, kind, task_id, version, promise, created_at, state,"
        " attempts, available_at, updated_at, dest_cast, dest_group, dest_id)"
        " SELECT key, address, kind, task_id, version + 1, promise, created_at, %s, 0,"
        " %s, updated_at, dest_cast, dest_group, dest_id FROM outbox WHERE key = %s",
        newer,
        FAR,
        key,
    )
    with stream(b, "g", worker):
        time.sleep(1.0)
    assert [r[0] for r in rows(url, key)] == ["failed", newer]


def test_a_send_settled_just_after_the_publish_is_offered_again_a_heartbeat_later(
    nodes: tuple[RunningServer, RunningServer], url: str
) -> None:
    """A peer claimed a message for the stream before the stream was published and
    settles it, backed off, just after the offer the publish made: the next
    heartbeat half a second or more later offers it again."""
    a, b = nodes
    key = unreachable(a, url, "in-flight", "poll://uni@g/elsewhere")
    with stream(b, "g", "w5") as w5:
        # What the peer's late settlement leaves: a row for w5, backed off for long.
        sql(
            url,
            "UPDATE outbox SET address = 'poll://uni@g/w5', dest_id = 'w5',"
            " available_at = available_at + 600000 WHERE key = %s AND state = 'pending'",
            key,
        )
        assert w5.next(timeout=3)["data"]["task"]["id"] == "in-flight"
