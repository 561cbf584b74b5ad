"""PostgreSQL going away and coming back under a running node.

The node reaches the database through a TCP proxy (``tests/helpers/lb.py``) that the test
stops and starts on the same port, which is what a database restart looks like to
the node: connections cut, then refused, then accepted again.  While it is away,
requests get 503 with a message and ``/ready`` says 503; afterwards the node
carries on by itself, and every request it answered 200 is in the database.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from helpers.lb import LoadBalancer
from helpers.pg import through, throwaway_database
from helpers.support import VERSION, RunningServer, running_server
from troth.server.config import Settings

FAR = 10**13


@pytest.fixture
def url() -> Iterator[str]:
    with throwaway_database("troth_outage") as u:
        yield u


def create(client: httpx.Client, id: str) -> tuple[int, Any]:
    envelope = {
        "kind": "promise.create",
        "head": {"corrId": id, "version": VERSION},
        "data": {"id": id, "timeoutAt": FAR, "tags": {}},
    }
    r = client.post("/", json=envelope)
    body = r.json()
    assert r.status_code == body["head"]["status"]
    return r.status_code, body["data"]


def test_requests_during_an_outage_get_503_and_nothing_acknowledged_is_lost(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = LoadBalancer([int(conninfo_to_dict(url).get("port") or 5432)]).start()
    port = proxy.port
    settings = Settings(store="postgres", postgres_url=through(url, port), access_log=False)
    answers: dict[str, int] = {}
    stop = threading.Event()

    def load(server: RunningServer) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            i = 0
            while not stop.is_set():
                id = f"p{i}"
                answers[id] = create(client, id)[0]
                i += 1
                time.sleep(0.005)

    with running_server(settings) as server:
        writer = threading.Thread(target=load, args=(server,))
        writer.start()
        try:
            time.sleep(0.5)
            proxy.stop()  # the database "goes down": connections cut, then refused
            deadline = time.monotonic() + 10
            while 503 not in answers.values():
                assert time.monotonic() < deadline, "no 503 while the database was away"
                time.sleep(0.02)
            status, message = create(server.client, "during")
            assert status == 503 and "Store unavailable" in message, message
            assert server.client.get("/ready").status_code == 503
            time.sleep(0.5)
            proxy = LoadBalancer(proxy.backends, port=port).start()  # back up
            deadline = time.monotonic() + 15
            while create(server.client, f"after-{time.monotonic()}")[0] != 200:
                assert time.monotonic() < deadline, "the node did not reconnect"
                time.sleep(0.1)
            assert server.client.get("/ready").status_code == 200
            time.sleep(0.3)
        finally:
            stop.set()
            writer.join(30)
    proxy.stop()

    # An outage is expected operation: warnings, not errors with tracebacks.
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    # The outage is an episode of the store's health: logged when it began and ended.
    assert any("store refuses writes (unavailable)" in r.getMessage() for r in caplog.records)
    assert any("store takes writes again" in r.getMessage() for r in caplog.records)

    statuses = set(answers.values())
    assert statuses <= {200, 503}, statuses
    assert 200 in statuses and 503 in statuses
    with psycopg.connect(url) as conn:
        stored = {r[0] for r in conn.execute("SELECT id FROM promises").fetchall()}
    acknowledged = {id for id, status in answers.items() if status == 200}
    assert acknowledged <= stored  # nothing acknowledged is lost
    # the load kept going after the outage, on the reconnected node
    last = max(answers, key=lambda id: int(id[1:]))
    assert answers[last] == 200
