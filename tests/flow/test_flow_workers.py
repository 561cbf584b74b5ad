"""A concurrency limit with real workers: ten raw SSE workers of one group (sockets,
as an SDK holds them) run thirty tasks of 0.3 s under ``concurrency 3``.  Never more
than three run at once, three do run at once (a freed slot's next ``execute`` goes
at once, not at the retry timer), and the whole takes little more than the ideal
ten rounds.  On PostgreSQL, setting a limit is refused (501) and changes nothing."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import pytest

from helpers.pg import throwaway_database
from helpers.sse import stream
from helpers.support import RunningServer, running_server
from helpers.wire import action
from troth.server.config import Settings

FAR = 10**13
WORKERS = 10
TASKS = 30
LIMIT = 3
WORK_S = 0.3

pytestmark = pytest.mark.timeout(120)


class Running:
    """How many tasks run at once, and the most there ever were."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.done: list[str] = []

    def start(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def end(self, id: str) -> None:
        with self.lock:
            self.now -= 1
            self.done.append(id)


def work(server: RunningServer, name: str, running: Running, stop: threading.Event) -> None:
    """One worker: acquire what it is sent, work 0.3 s, fulfil.  A refused acquire
    (another worker has it, or the limit holds it) is dropped, as the SDKs drop it."""
    with stream(server, "fc", name) as s:
        while not stop.is_set():
            try:
                message = s.messages.get(timeout=0.1)
            except queue.Empty:
                continue
            task = message["data"]["task"]
            body = {"id": task["id"], "version": task["version"], "pid": name, "ttl": 60_000}
            status, _ = server.call("task.acquire", body)
            if status != 200:
                continue
            running.start()
            time.sleep(WORK_S)
            running.end(task["id"])
            settle = action("promise.settle", {"id": task["id"], "state": "resolved"})
            body = {"id": task["id"], "version": task["version"] + 1, "action": settle}
            server.ok("task.fulfill", body)


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_ten_workers_run_at_most_three_tasks_at_once(store: str, tmp_path: Path) -> None:
    db = str(tmp_path / "w.db") if store == "sqlite" else ":memory:"
    with running_server(Settings(store=store, db=db)) as server:
        r = server.client.post("/ops/limits/set", json={"group": "fc", "concurrency": LIMIT})
        assert r.status_code == 200, r.text
        running, stop = Running(), threading.Event()
        threads = [
            threading.Thread(target=work, args=(server, f"w{i}", running, stop), daemon=True)
            for i in range(WORKERS)
        ]
        for t in threads:
            t.start()
        time.sleep(0.5)  # every stream open (each worker's stream() waits for it)
        began = time.monotonic()
        for i in range(TASKS):
            tags = {"resonate:target": "poll://any@fc"}
            server.ok("promise.create", {"id": f"job{i}", "timeoutAt": FAR, "tags": tags})
        deadline = began + 60
        while len(running.done) < TASKS and time.monotonic() < deadline:
            time.sleep(0.05)
        took = time.monotonic() - began
        stop.set()
        for t in threads:
            t.join(10)
    assert sorted(running.done) == sorted(f"job{i}" for i in range(TASKS))
    assert running.most == LIMIT
    ideal = TASKS / LIMIT * WORK_S
    print(f"{TASKS} tasks of {WORK_S} s, limit {LIMIT}: {took:.2f} s (ideal {ideal:.1f} s)")
    assert took <= 1.5 * ideal + 2, took


def test_postgres_refuses_a_limit_until_it_keeps_them() -> None:
    with (
        throwaway_database("troth_flow") as url,
        running_server(Settings(store="postgres", postgres_url=url)) as server,
    ):
        r = server.client.post("/ops/limits/set", json={"group": "fc", "concurrency": 3})
        assert r.status_code == 501
        assert "not available on the postgres store" in r.json()["error"]
        assert server.client.get("/ops/limits").json() == {"limits": []}
