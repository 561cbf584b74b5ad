"""A short outage costs a request time, not an answer (``postgres_outage_wait``).

As in test_pg_outage.py, the node reaches the database through a TCP proxy the
test stops and starts on the same port.  A request that arrives while the database
is away waits for it, up to ``postgres_outage_wait``: back within the wait, the
request is answered 200; away for longer, 503 once the wait is over — and not
before.
"""

from __future__ import annotations

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
from helpers.support import VERSION, running_server
from troth.server.config import Settings

FAR = 10**13


def create(client: httpx.Client, id: str) -> tuple[int, Any]:
    envelope = {
        "kind": "promise.create",
        "head": {"corrId": id, "version": VERSION},
        "data": {"id": id, "timeoutAt": FAR, "tags": {}},
    }
    r = client.post("/", json=envelope, timeout=30)
    return r.status_code, r.json()["data"]


@pytest.fixture
def url() -> Iterator[str]:
    with throwaway_database("troth_wait") as u:
        yield u


def test_a_request_waits_out_a_short_outage(url: str) -> None:
    proxy = LoadBalancer([int(conninfo_to_dict(url).get("port") or 5432)]).start()
    port = proxy.port
    settings = Settings(
        store="postgres",
        postgres_url=through(url, port),
        postgres_outage_wait=8.0,
        access_log=False,
    )
    answer: list[tuple[int, float]] = []
    try:
        with running_server(settings) as server:
            assert create(server.client, "before")[0] == 200
            proxy.stop()  # connections cut, then refused

            def send() -> None:
                t0 = time.monotonic()
                status = create(server.client, "during")[0]
                answer.append((status, time.monotonic() - t0))

            sender = threading.Thread(target=send)
            sender.start()
            time.sleep(1.0)
            assert not answer, f"answered while the database was away: {answer}"
            proxy = LoadBalancer(proxy.backends, port=port).start()  # back up
            sender.join(15)
            assert answer and answer[0][0] == 200, answer
            assert 0.9 <= answer[0][1] < 8.0, answer
    finally:
        proxy.stop()
    with psycopg.connect(url) as conn:
        ids = {r[0] for r in conn.execute("SELECT id FROM promises").fetchall()}
    assert {"before", "during"} <= ids


def test_a_longer_outage_answers_503_when_the_wait_is_over(url: str) -> None:
    proxy = LoadBalancer([int(conninfo_to_dict(url).get("port") or 5432)]).start()
    settings = Settings(
        store="postgres",
        postgres_url=through(url, proxy.port),
        postgres_outage_wait=1.5,
        access_log=False,
    )
    try:
        with running_server(settings) as server:
            assert create(server.client, "before")[0] == 200
            proxy.stop()
            t0 = time.monotonic()
            status, message = create(server.client, "refused")
            waited = time.monotonic() - t0
            assert status == 503 and "Store unavailable" in message, message
            assert 1.4 <= waited < 6.0, waited
            # the node gave up: while the database stays away, it answers at once
            t0 = time.monotonic()
            assert create(server.client, "refused-2")[0] == 503
            assert time.monotonic() - t0 < 1.4
    finally:
        proxy.stop()
