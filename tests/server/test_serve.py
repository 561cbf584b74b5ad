"""``troth serve`` / ``troth dev`` as a user runs them: a real process, a real file.

Graceful shutdown: SIGTERM while requests are in flight answers them and commits;
every acknowledged write is in the file when the server starts again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from helpers.serve_process import serve
from helpers.support import VERSION


def create(client: httpx.Client, id: str) -> int:
    env = {
        "kind": "promise.create",
        "head": {"corrId": id, "version": VERSION},
        "data": {"id": id, "timeoutAt": 10**13},
    }
    return client.post("/", json=env).status_code


def test_serve_uses_troth_db_in_the_working_directory(tmp_path: Path) -> None:
    with serve(["serve"], tmp_path, tmp_path / "log") as (_, url), httpx.Client(base_url=url) as c:
        assert create(c, "a") == 200
        assert c.get("/ready").json() == {"status": "ready", "store": "sqlite"}
    assert (tmp_path / "troth.db").exists()


def test_ctrl_c_stops_gracefully_with_status_130_and_no_traceback(tmp_path: Path) -> None:
    """As from a terminal, with SIGINT not ignored (tests/conftest.py sees to that)."""
    log = tmp_path / "log"
    with serve(["serve", "--db", "t.db"], tmp_path, log) as (proc, url):
        with httpx.Client(base_url=url) as c:
            assert create(c, "a") == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 130, log.read_text()
    text = log.read_text()
    assert "Application shutdown complete" in text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text


def test_sigterm_finishes_in_flight_requests_and_nothing_acknowledged_is_lost(
    tmp_path: Path,
) -> None:
    acknowledged: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    log = tmp_path / "log"

    with serve(["serve", "--db", "t.db"], tmp_path, log) as (proc, url):

        def client(n: int) -> None:
            with httpx.Client(base_url=url, timeout=10) as c:
                i = 0
                while not stop.is_set():
                    id = f"c{n}-{i}"
                    try:
                        if create(c, id) == 200:
                            with lock:
                                acknowledged.append(id)
                    except httpx.HTTPError:
                        return
                    i += 1

        threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 15
        while len(acknowledged) < 60:  # the stop comes in the middle of a load
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal after its graceful shutdown completed.
        assert proc.wait(15) in (0, -signal.SIGTERM), log.read_text()
        assert "Application shutdown complete" in log.read_text()
        stop.set()
        for t in threads:
            t.join(10)
    assert len(acknowledged) > 50
    with (
        serve(["serve", "--db", "t.db"], tmp_path, log) as (_, url),
        httpx.Client(base_url=url) as c,
    ):
        for id in acknowledged:
            env = {
                "kind": "promise.get",
                "head": {"corrId": id, "version": VERSION},
                "data": {"id": id},
            }
            assert c.post("/", json=env).status_code == 200, id


def test_dev_is_debug_on_a_fresh_memory_store(tmp_path: Path) -> None:
    with serve(["dev"], tmp_path, tmp_path / "log") as (_, url), httpx.Client(base_url=url) as c:
        env = {"kind": "debug.snap", "head": {"corrId": "s", "version": VERSION}, "data": {}}
        r = c.post("/", json=env)
        assert r.status_code == 200
        assert r.json()["data"]["promises"] == []
        assert c.get("/ready").json()["store"] == "memory"
    assert not (tmp_path / "troth.db").exists()


def test_access_log_has_one_line_per_request(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with (
        serve(["serve", "--db", "t.db"], tmp_path, log) as (_, url),
        httpx.Client(base_url=url) as c,
    ):
        assert create(c, "logged-1") == 200
        env = {
            "kind": "promise.get",
            "head": {"corrId": "get-7", "version": VERSION},
            "data": {"id": "x"},
        }
        assert c.post("/", json=env).status_code == 404
        time.sleep(0.2)
    text = log.read_text()
    assert "promise.create corrId=logged-1 status=200 ms=" in text
    assert "promise.get corrId=get-7 status=404 ms=" in text


def test_bad_configuration_exits_with_a_message(tmp_path: Path) -> None:
    env = {**os.environ, "TROTH_RETRY_TIMEOUT": "0"}
    r = subprocess.run(
        [sys.executable, "-m", "troth.cli.main", "serve"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert "retry_timeout must be > 0" in r.stderr
