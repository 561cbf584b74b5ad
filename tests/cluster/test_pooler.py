"""troth behind PgBouncer in transaction mode: what needs a session, and what it does
instead (docs/operations.md, "Behind a connection pooler").

The request path through the pooler is the differential and cluster tests' business
(they run through it too); here: the settings each transaction carries, a node
without a LISTEN connection, and the startup check that refuses a transaction
pooler the settings do not expect.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace

import psycopg
import pytest

from helpers.pg import throwaway_database
from helpers.pgbouncer import Bouncer, free_port, needs_pgbouncer, pgbouncer
from helpers.sse import stream
from helpers.support import running_server
from troth.server.config import Settings
from troth.store.postgres import PostgresStore
from troth.store.postgres.outbox import OutboxSession
from troth.store.postgres.probe import keeps_session

pytestmark = needs_pgbouncer

FAR = 10**13


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with throwaway_database("troth_pooler") as u:
        PostgresStore(u).close()  # create the schema
        yield u


@pytest.fixture(scope="module")
def bouncer(url: str) -> Iterator[Bouncer]:
    with pgbouncer("transaction", pool_size=2) as b:
        yield b


def test_every_transaction_carries_the_sessions_settings(url: str, bouncer: Bouncer) -> None:
    """Four sessions on two server connections: each transaction sees its own
    session's settings, whichever server connection it lands on."""
    failures: list[str] = []
    show = "SELECT current_setting('lock_timeout'), current_setting('synchronous_commit')"
    expected = ("50ms", "off")

    def work() -> None:
        session = OutboxSession(bouncer.url(url), max_attempts=3, lock_timeout=0.05, pooled=True)
        try:
            for i in range(50):
                # a statement with a parameter, many times: it would be prepared
                rows = session.run(
                    lambda cur, i=i: cur.execute(f"{show}, %s::int", (i,)).fetchall()
                )
                if rows != [(*expected, i)]:
                    failures.append(repr(rows))
                one = session.run_single(lambda cur: cur.execute(show).fetchall())
                if one != [expected]:
                    failures.append(repr(one))
        except psycopg.Error as exc:
            failures.append(repr(exc))
        finally:
            session.close()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures[:5]


def test_the_probe_tells_a_transaction_pooler_from_a_session(url: str, bouncer: Bouncer) -> None:
    assert keeps_session(url)
    assert not keeps_session(bouncer.url(url))
    with pgbouncer("session") as session_pooler:
        assert keeps_session(session_pooler.url(url))


def test_serve_refuses_a_transaction_pooler_it_was_not_told_of(url: str, bouncer: Bouncer) -> None:
    argv = [sys.executable, "-m", "troth.cli.main", "serve", "--store", "postgres"]
    argv += ["--port", str(free_port()), "--postgres-url", bouncer.url(url)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "set postgres_pool_mode = transaction" in lines[0], lines


def test_a_node_without_a_listen_connection_says_so_and_still_delivers(
    url: str, bouncer: Bouncer, caplog: pytest.LogCaptureFixture
) -> None:
    """No LISTEN: the warning at startup, and a message produced on one node reaches
    the worker on the other by the delivery loop's periodic sweep."""
    base = Settings(
        store="postgres",
        postgres_url=bouncer.url(url),
        postgres_pool_mode="transaction",
        debug=True,
        access_log=False,
        keepalive=0.2,
    )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE promises, tasks, schedules, outbox, nodes, connections")
    caplog.set_level(logging.WARNING, logger="troth.cluster")
    with (
        running_server(replace(base, node_id="a")) as a,
        running_server(replace(base, node_id="b")) as b,
    ):
        for n in (a, b):
            n.ok("debug.stop", {})
        assert "does not LISTEN" in caplog.text
        with stream(b, "g", "w1") as s:
            a.ok(
                "promise.create",
                {"id": "far", "timeoutAt": FAR, "tags": {"resonate:target": "poll://uni@g/w1"}},
            )
            message = s.next(timeout=8)
        assert message["data"]["task"]["id"] == "far"
