"""A SQLite node whose disk fills up, on a real 4 MB tmpfs, and then gets room again.

While the disk is full: writes answer 503 with ``Retry-After`` and a message that
says the storage is full, reads answer as before, ``/ready`` says 503 with the
reason, the metrics say so, and the log has one line for the episode (no traceback
per batch).  Once room is made, writes resume by themselves, ``/ready`` is 200
again, the WAL that grew is given back, and every acknowledged write is in the file.
"""

from __future__ import annotations

import base64
import logging
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from helpers.metrics import metric
from helpers.support import VERSION, running_server
from helpers.tmpfs import fill, tmpfs
from troth.server.config import Settings

FAR = 10**13
#: Bytes of each promise's param: a few writes fill what the filler leaves.
PARAM = 16 * 1024


def create(client: httpx.Client, id: str) -> httpx.Response:
    data = base64.b64encode(id.encode() * (PARAM // len(id))).decode()
    envelope = {
        "kind": "promise.create",
        "head": {"corrId": id, "version": VERSION},
        "data": {"id": id, "timeoutAt": FAR, "param": {"data": data}, "tags": {}},
    }
    return client.post("/", json=envelope)


def test_a_full_disk_refuses_writes_with_503_and_they_resume_when_room_is_made(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    with tmpfs("4m") as disk:
        db = disk / "troth.db"
        settings = Settings(store="sqlite", db=str(db), access_log=False)
        acknowledged: list[str] = []
        with running_server(settings) as server:
            client = server.client
            assert client.get("/ready").status_code == 200
            # A message no worker takes: the delivery keeps writing its retries, and
            # meets the full disk too.
            undelivered = {
                "kind": "promise.create",
                "head": {"corrId": "u", "version": VERSION},
                "data": {"id": "u", "timeoutAt": FAR, "tags": {"resonate:target": "poll://any@g"}},
            }
            assert client.post("/", json=undelivered).status_code == 200
            sent = time.monotonic()  # tried at once, then 1 s and 5 s later
            acknowledged.append("u")
            filler = fill(disk, leave=600 * 1024)
            # Write until the disk refuses (bounded: the space left holds a few dozen).
            refused: httpx.Response | None = None
            for i in range(400):
                r = create(client, f"p{i}")
                if r.status_code == 200:
                    acknowledged.append(f"p{i}")
                    continue
                refused = r
                break
            assert refused is not None, "the disk never filled up"
            assert acknowledged, "nothing was stored before the disk filled up"

            # The client: 503, Retry-After, a message that says the storage is full.
            body = refused.json()
            assert refused.status_code == 503 == body["head"]["status"], body
            assert refused.headers["retry-after"] == "1"
            assert body["data"].startswith("Storage is full"), body["data"]
            again = create(client, "during")
            assert again.status_code == 503 and again.json()["data"].startswith("Storage is full")

            # Reads keep working.
            get = {"kind": "promise.get", "head": {"corrId": "g", "version": VERSION}}
            r = client.post("/", json={**get, "data": {"id": acknowledged[0]}})
            assert r.status_code == 200, r.text
            assert r.json()["data"]["promise"]["id"] == acknowledged[0]

            # The operator: /ready 503 with the reason, the metrics.
            ready = client.get("/ready")
            assert ready.status_code == 503
            assert ready.json()["reason"] == "disk_full"
            assert "full" in ready.json()["error"]
            assert metric(server.url, "troth_store_writable") == 0
            assert metric(server.url, 'troth_store_write_errors_total{reason="disk_full"}') >= 2
            assert client.get("/health").status_code == 200  # alive, only not ready
            # The delivery's retry 5 s after the first send meets the full disk.
            time.sleep(max(sent + 6.5 - time.monotonic(), 0))
            assert client.get("/ready").status_code == 503
            wal = Path(f"{db}-wal")
            grown = wal.stat().st_size

            # Room again: writes resume by themselves, without a request to start them.
            filler.unlink()
            deadline = time.monotonic() + 10
            while client.get("/ready").status_code != 200:
                assert time.monotonic() < deadline, client.get("/ready").text
                time.sleep(0.2)
            assert metric(server.url, "troth_store_writable") == 1
            r = create(client, "after")
            assert r.status_code == 200, r.text
            acknowledged.append("after")
            # The WAL that grew while nothing could be checkpointed is given back.
            deadline = time.monotonic() + 10
            while wal.stat().st_size >= grown:
                assert time.monotonic() < deadline, (wal.stat().st_size, grown)
                time.sleep(0.1)

        # One line when the episode began, one when it ended; no traceback, no error.
        messages = [r.getMessage() for r in caplog.records]
        assert sum("store refuses writes (disk_full)" in m for m in messages) == 1, messages
        assert sum("store takes writes again" in m for m in messages) == 1, messages
        assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []

        # Nothing acknowledged is lost: every 200 is in the file, which is sound.
        with sqlite3.connect(db) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            stored = {row[0] for row in conn.execute("SELECT id FROM promises")}
        assert set(acknowledged) <= stored
        assert "during" not in stored
