"""``troth explain`` on workflows the Python SDK really ran: an RPC to a
group with no worker, a durable sleep, and a worker SIGSTOPped while it holds the
workflow's lease.  Each test runs ``troth serve`` as a child process (SQLite file, or
PostgreSQL on a throwaway database) and the SDK program ``tests/sdk/stuck.py``, and
asks ``GET /ops/explain`` (what ``troth explain`` prints) until the explanation
settles on the expected reason."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.sdk_env import Procs, PythonSdk
from helpers.troth_process import LoggedServer as Server

pytestmark = pytest.mark.timeout(180)

WAIT = 60.0


@pytest.fixture
def live(procs: Procs, store: str, postgres_url: str | None, tmp_path: Path) -> Iterator[Server]:
    server = Server(procs, store, tmp_path / "troth.db", postgres_url)
    server.start()
    yield server


def explanation(server: Server, id: str) -> dict[str, Any]:
    r = httpx.get(f"{server.url}/ops/explain", params={"id": id}, timeout=10)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def leaves_once(procs: Procs, server: Server, id: str, reasons: set[str]) -> dict[str, Any]:
    """The explanation of ``id`` once its blockers' reasons are ``reasons``."""
    seen: dict[str, Any] = {}

    def settled() -> bool:
        seen.update(explanation(server, id))
        return {b["reason"] for b in seen["blockers"]} == reasons

    procs.wait_for(f"explain {id} to give {sorted(reasons)}", settled, WAIT)
    return seen


def start(procs: Procs, sdk: PythonSdk, server: Server, mode: str) -> tuple[str, int]:
    wf = f"stuck-{mode}-{uuid.uuid4().hex[:6]}"
    proc = procs.start(
        "workflow", sdk.program("stuck.py", "--url", server.url, "--id", wf, "--mode", mode)
    )
    line = procs.wait_line(proc, r"^started \S+ pid=\d+$", WAIT)[0]
    return wf, int(line.rsplit("=", 1)[1])


def test_an_rpc_to_a_group_without_workers(
    procs: Procs, python_sdk: PythonSdk, live: Server
) -> None:
    wf, _ = start(procs, python_sdk, live, "rpc")
    answer = leaves_once(procs, live, wf, {"no_worker"})
    root = answer["root"]
    assert root["reason"] == "awaiting" and root["function"] == "stuck"
    [rpc] = root["awaiting"]
    assert rpc["id"].startswith(f"{wf}:") and rpc["function"] == "absent"
    assert "no worker connected to group `nobody`" in rpc["text"], rpc["text"]
    assert "to `poll://any@nobody" in rpc["text"]


def test_a_durable_sleep(procs: Procs, python_sdk: PythonSdk, live: Server) -> None:
    wf, _ = start(procs, python_sdk, live, "sleep")
    answer = leaves_once(procs, live, wf, {"sleeping"})
    [timer] = answer["root"]["awaiting"]
    assert timer["text"].startswith("durable sleep until ")
    assert "(in 9m" in timer["text"] or "(in 10m" in timer["text"], timer["text"]


def test_a_worker_stopped_while_it_holds_the_lease(
    procs: Procs, python_sdk: PythonSdk, live: Server
) -> None:
    wf, pid = start(procs, python_sdk, live, "slow")
    answer = leaves_once(procs, live, wf, {"held"})
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(1.0)
        root = explanation(live, wf)["root"]
        assert root["reason"] == "held", root
        holder = live.call("task.get", {"id": wf})[1]["task"]["pid"]
        assert f"task held by pid `{holder}` on node `" in root["text"], root["text"]
        assert "lease expires in" in root["text"] or "lease expired" in root["text"]
        beat = root["evidence"]["lastHeartbeatAt"]
        time.sleep(2.0)  # stopped: no heartbeat moves the lease on
        again = explanation(live, wf)["root"]
        assert again["evidence"].get("lastHeartbeatAt", beat) == beat, (answer, again)
    finally:
        os.kill(pid, signal.SIGCONT)
