"""A PostgreSQL node whose database refuses writes, then takes them again.

Three real faults under a running node: the database switched to read-only
(``default_transaction_read_only``, the node's sessions terminated so that they
reconnect into it: SQLSTATE 25006), its tablespace full (the node's tables moved
to a tablespace on a 4 MB tmpfs: 53100), and the database out of reach (a TCP proxy
between node and database, stopped).  In each, writes answer 503 with the reason,
``/ready`` says 503 with it within a few seconds, the metrics say so; reads keep
working where the database can still read; and the node recovers by itself when
the fault ends, with every acknowledged write stored.
"""

from __future__ import annotations

import base64
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import psycopg
from psycopg.conninfo import conninfo_to_dict

from helpers.lb import LoadBalancer
from helpers.metrics import metric
from helpers.pg import ADMIN_URL, through, throwaway_database
from helpers.support import VERSION, RunningServer, running_server, wait_for
from helpers.tmpfs import fill, tmpfs
from troth.server.config import Settings
from troth.store.postgres import PostgresStore

FAR = 10**13


def create(client: httpx.Client, id: str, size: int = 0) -> httpx.Response:
    data: dict[str, Any] = {"id": id, "timeoutAt": FAR, "tags": {}}
    if size:
        # Random bytes: PostgreSQL cannot compress them into a smaller row.
        data["param"] = {"data": base64.b64encode(os.urandom(size)).decode()}
    envelope = {"kind": "promise.create", "head": {"corrId": id, "version": VERSION}, "data": data}
    return client.post("/", json=envelope)


def get(client: httpx.Client, id: str) -> httpx.Response:
    envelope = {"kind": "promise.get", "head": {"corrId": f"g-{id}", "version": VERSION}}
    return client.post("/", json={**envelope, "data": {"id": id}})


def admin(sql: str) -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


def terminate(dbname: str) -> None:
    """End every session of ``dbname``: the node's connections break and reopen."""
    admin(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = '{dbname}' AND pid <> pg_backend_pid()"
    )


def stored(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM promises").fetchall()}


def ready(server: RunningServer) -> httpx.Response:
    return server.client.get("/ready")


def test_a_read_only_database_refuses_writes_and_ready_says_so() -> None:
    with throwaway_database("troth_readonly") as url:
        dbname = conninfo_to_dict(url)["dbname"]
        settings = Settings(store="postgres", postgres_url=url, access_log=False)
        with running_server(settings) as server:
            client = server.client
            acknowledged = [id for id in ("a", "b") if create(client, id).status_code == 200]
            assert acknowledged == ["a", "b"]
            admin(f"ALTER DATABASE {dbname} SET default_transaction_read_only = on")
            terminate(dbname)

            refusal: list[httpx.Response] = []

            def refused() -> bool:
                r = create(client, f"ro-{uuid.uuid4().hex[:8]}")
                assert r.status_code in (200, 503), r.text
                if r.status_code == 200:  # a session not yet reconnected
                    acknowledged.append(r.json()["data"]["promise"]["id"])
                elif r.json()["data"].startswith("Storage is read-only"):
                    refusal.append(r)
                    return True
                return False

            wait_for("writes refused as read-only", refused)
            r = refusal[0]
            assert r.headers["retry-after"] == "1"
            wait_for(
                "/ready says read_only", lambda: ready(server).json().get("reason") == "read_only"
            )
            assert ready(server).status_code == 503
            assert metric(server.url, "troth_store_writable") == 0
            assert metric(server.url, 'troth_store_write_errors_total{reason="read_only"}') >= 1
            # Reads still work (a read session that was cut reconnects).
            wait_for("reads work", lambda: get(client, "a").status_code == 200)

            admin(f"ALTER DATABASE {dbname} RESET default_transaction_read_only")
            terminate(dbname)
            # No request needed: the node's probes see the database writable again.
            wait_for("/ready 200 again", lambda: ready(server).status_code == 200)
            assert metric(server.url, "troth_store_writable") == 1
            assert create(client, "after").status_code == 200
            acknowledged.append("after")
        assert set(acknowledged) <= stored(url)


@contextmanager
def tablespace_on(disk_dir: str) -> Iterator[str]:
    """A tablespace on ``disk_dir`` (which postgres owns); dropped after."""
    name = f"troth_full_{uuid.uuid4().hex[:8]}"
    admin(f"CREATE TABLESPACE {name} LOCATION '{disk_dir}'")
    try:
        yield name
    finally:
        admin(f"DROP TABLESPACE IF EXISTS {name}")


def test_a_full_tablespace_refuses_writes_and_writes_resume_when_room_is_made() -> None:
    with (
        tmpfs("4m", owner="postgres") as disk,
        tablespace_on(str(disk)) as space,
        throwaway_database("troth_full") as url,
    ):
        PostgresStore(url).close()  # the schema, then the node's tables onto the small disk
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE ALL IN TABLESPACE pg_default SET TABLESPACE {space}")  # type: ignore[arg-type]
            conn.execute(f"ALTER INDEX ALL IN TABLESPACE pg_default SET TABLESPACE {space}")  # type: ignore[arg-type]
        settings = Settings(store="postgres", postgres_url=url, access_log=False)
        acknowledged: list[str] = []
        with running_server(settings) as server:
            client = server.client
            filler = fill(disk, leave=512 * 1024)
            refused: httpx.Response | None = None
            for i in range(200):
                r = create(client, f"p{i}", size=16 * 1024)
                if r.status_code == 200:
                    acknowledged.append(f"p{i}")
                    continue
                refused = r
                break
            assert refused is not None, "the tablespace never filled up"
            body = refused.json()
            assert refused.status_code == 503, body
            assert body["data"].startswith("Storage is full"), body["data"]
            assert refused.headers["retry-after"] == "1"
            ready_now = ready(server)
            assert ready_now.status_code == 503 and ready_now.json()["reason"] == "disk_full"
            assert metric(server.url, 'troth_store_write_errors_total{reason="disk_full"}') >= 1
            assert get(client, acknowledged[0]).status_code == 200  # reads keep working

            filler.unlink()
            wait_for("/ready 200 again", lambda: ready(server).status_code == 200)
            assert create(client, "after", size=16 * 1024).status_code == 200
            acknowledged.append("after")
        assert set(acknowledged) <= stored(url)


def test_ready_says_503_with_a_reason_when_the_database_is_out_of_reach() -> None:
    """No request at all: /ready alone finds out, says why, and finds the way back."""
    with throwaway_database("troth_reach") as url:
        proxy = LoadBalancer([int(conninfo_to_dict(url).get("port") or 5432)]).start()
        port = proxy.port
        try:
            settings = Settings(store="postgres", postgres_url=through(url, port), access_log=False)
            with running_server(settings) as server:
                assert ready(server).status_code == 200
                proxy.stop()
                started = time.monotonic()
                wait_for("/ready 503", lambda: ready(server).status_code == 503, 10)
                assert time.monotonic() - started < 6
                answer = ready(server).json()
                assert answer["reason"] == "unavailable" and answer["error"], answer
                assert metric(server.url, "troth_store_writable") == 0
                proxy = LoadBalancer(proxy.backends, port=port).start()
                wait_for("/ready 200 again", lambda: ready(server).status_code == 200, 15)
                assert create(server.client, "after").status_code == 200
        finally:
            proxy.stop()
