"""``troth cancel`` on a workflow that a published SDK worker is running.

A workflow of slow sequential steps runs on a real worker beside a second one; a few
steps in, the first is cancelled (``POST /ops/cancel``, as ``troth cancel`` sends it).
No step of it may start after the cancel was answered — a step already running may
finish, but what it then records is refused, so the workflow goes no further —
every promise of its tree is ``rejected_canceled``, and the workflow beside it
finishes untouched on the same worker.  ``troth serve`` is a child process on a
SQLite file or PostgreSQL; the SDK programs are ``tests/sdk/cancel.py`` and ``cancel_ts.mjs``.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest

from helpers.sdk_env import NodeSdk, Procs, PythonSdk
from helpers.troth_process import LoggedServer

pytestmark = pytest.mark.timeout(180)

STEPS = 20
OTHER_STEPS = 10
#: Steps of the cancelled workflow that start before the cancel is sent.
BEFORE_CANCEL = 4
RUN_TIMEOUT = 60.0


@pytest.fixture
def live(procs: Procs, store: str, postgres_url: str | None, tmp_path: Path) -> LoggedServer:
    server = LoggedServer(procs, store, tmp_path / "troth.db", postgres_url)
    server.start()
    return server


def starts(out: str, wf: str) -> list[tuple[int, float]]:
    """``(step, unix time)`` of each ``start`` line of workflow ``wf``."""
    found = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "start" and parts[1] == wf:
            found.append((int(parts[2]), float(parts[3])))
    return found


def cancel_mid_run(procs: Procs, live: LoggedServer, argv: list[str], wf: str, other: str) -> str:
    worker = procs.start("worker", argv)
    procs.wait_line(worker, rf"^start {wf} {BEFORE_CANCEL - 1} ", RUN_TIMEOUT)
    r = httpx.post(f"{live.url}/ops/cancel", json={"id": wf, "reason": "test"}, timeout=30)
    answered = time.time()
    assert r.status_code == 200, r.text
    assert r.json()["canceled"] >= 1
    out = procs.wait_exit(worker, RUN_TIMEOUT)

    late = [(i, at) for i, at in starts(out, wf) if at > answered]
    assert late == [], f"steps of {wf} started after the cancel was answered: {late}\n{out}"
    ran = starts(out, wf)
    assert BEFORE_CANCEL <= len(ran) < STEPS, out
    tree = httpx.get(f"{live.url}/ops/tree", params={"id": wf}, timeout=10).json()
    states = {p["id"]: p["state"] for p in tree["promises"]}
    assert states[wf] == "rejected_canceled", states
    assert set(states.values()) <= {"rejected_canceled", "resolved"}, states
    # A child settled by its step before the cancel stays resolved; none stays pending.
    assert list(states.values()).count("rejected_canceled") >= 1
    # The workflow beside it ran every step and finished, on the same worker.
    assert [i for i, _ in starts(out, other)] == list(range(OTHER_STEPS)), out
    assert f"result {other} {sum(range(OTHER_STEPS))}" in out, out
    assert live.promise_value(other)[0] == "resolved"
    return out


def test_python_worker_stops_a_cancelled_workflow(
    python_sdk: PythonSdk, procs: Procs, live: LoggedServer
) -> None:
    wf, other = f"cancel-py-{uuid.uuid4().hex[:8]}", f"beside-py-{uuid.uuid4().hex[:8]}"
    argv = python_sdk.program(
        "cancel.py", "--url", live.url, "--id", wf, "--other", other,
        "--steps", str(STEPS), "--other-steps", str(OTHER_STEPS),
    )  # fmt: skip
    out = cancel_mid_run(procs, live, argv, wf, other)
    print(out)


def test_typescript_worker_stops_a_cancelled_workflow(
    node_sdk: NodeSdk, procs: Procs, live: LoggedServer
) -> None:
    wf, other = f"cancel-ts-{uuid.uuid4().hex[:8]}", f"beside-ts-{uuid.uuid4().hex[:8]}"
    argv = node_sdk.program(
        "cancel_ts.mjs", live.url, "cancel", wf, str(STEPS), other, str(OTHER_STEPS), "20"
    )
    out = cancel_mid_run(procs, live, argv, wf, other)
    print(out)
