"""A node of its own (SQLite) offers again what could not be delivered to a worker's
stream while it was away, the moment that worker connects (``OutboxStore.revive``;
on PostgreSQL: ``cluster/test_stranded.py``).  A real server, real SSE streams, the
rows read from the database file.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.sse import stream
from helpers.store_jobs import outbox_rows
from helpers.support import RunningServer, running_server, wait_for
from troth.outbox import codes
from troth.server.config import Settings

pytestmark = pytest.mark.timeout(60)

FAR = 10**13


@pytest.fixture
def node(tmp_path: Path) -> Iterator[RunningServer]:
    # One send per row: a message for a stream nobody holds fails at its first try.
    settings = Settings(
        store="sqlite", db=str(tmp_path / "t.db"), access_log=False, keepalive=0.2, max_attempts=1
    )
    with running_server(settings) as server:
        yield server


def test_what_failed_while_the_worker_was_away_reaches_it_when_it_connects(
    node: RunningServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "t.db"
    for id, address in (("gave-up", "poll://uni@g/w1"), ("other", "poll://uni@g/w9")):
        node.ok(
            "promise.create", {"id": id, "timeoutAt": FAR, "tags": {"resonate:target": address}}
        )
    gave_up = [("failed", codes.ATTEMPTS_EXHAUSTED, 1)]
    wait_for(
        "both to fail", lambda: outbox_rows(db, "gave-up") == gave_up == outbox_rows(db, "other")
    )
    with caplog.at_level(logging.INFO, logger="troth"), stream(node, "G", "w1") as w1:
        assert w1.next(timeout=3)["data"]["task"]["id"] == "gave-up"
    wait_for("its row delivered", lambda: outbox_rows(db, "gave-up") == [("completed", None, 0)])
    assert outbox_rows(db, "other") == gave_up  # another stream's message stays as it was
    assert "worker connected to g/w1: 1 messages that could not be delivered" in caplog.text


def test_a_backed_off_message_goes_out_as_its_worker_connects(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    settings = Settings(store="sqlite", db=str(db), access_log=False, keepalive=0.2)
    with running_server(settings) as node:
        node.ok(
            "promise.create",
            {"id": "held", "timeoutAt": FAR, "tags": {"resonate:target": "poll://uni@g/w2"}},
        )
        wait_for(
            "a first try", lambda: outbox_rows(db, "held") == [("pending", codes.NO_CONNECTION, 1)]
        )
        # Backed off 1 s, then 4 s; pushed out of reach: the connection is what brings it.
        conn = sqlite3.connect(db, timeout=10)
        with conn:
            conn.execute(
                "UPDATE outbox SET available_at = available_at + 600000 WHERE key = 'held'"
            )
        conn.close()
        with stream(node, "g", "w2") as w2:
            assert w2.next(timeout=3)["data"]["task"]["id"] == "held"
