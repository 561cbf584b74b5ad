"""A task that keeps bouncing backs off, with the published TypeScript SDK (issue 18).

A worker of the group that lacks the function (``tests/sdk/bounce_ts.mjs worker …
lacking``) answers every ``execute`` for it with "is not registered. Will drop." and a
``task.release``; before the backoff troth re-offered the task at once and the same
worker took it again, one cycle every few milliseconds for as long as it ran.  Now
(docs/protocol.md, "Tasks that keep bouncing") the bounce rate falls to the backoff's
(50 ms doubling per bounce, at most ``retry_timeout``), troth warns once naming the
task and its group, and when a worker that has the function connects to the group
the held ``execute`` goes out at once and the task completes: nothing is lost.

Each test runs ``troth serve`` as a child process on SQLite or PostgreSQL (a
throwaway database), counts the leases granted on the task through ``task.acquire``
from the ``troth.grants`` log, and times the run from the log's timestamps.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from helpers.sdk_env import NodeSdk, Procs
from helpers.troth_process import GRANT, LoggedServer

pytestmark = pytest.mark.timeout(180)

#: How long the lacking worker is left bouncing the task.
BOUNCE_FOR_S = 10.0
#: Leases granted in that window at most: the backoff's (3 at once, then one after
#: 50, 100, … 3200 ms: 11 in 10 s), with slack; without it, over a thousand.
MAX_ACQUIRES = 16
#: ``retry_timeout`` (ms) of the server: the cap of the backoff; long, so that a held
#: execute still has seconds to wait when the good worker connects.
RETRY_TIMEOUT = 20_000
#: From the good worker's connection to its lease, at most (s): it does not wait out
#: the backoff (the execute held when it connects is due seconds later).
AT_ONCE_S = 1.5
RUN_TIMEOUT = 60.0

STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def stamp(line: str) -> datetime:
    m = STAMP.match(line)
    assert m is not None, line
    return datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f")


@pytest.fixture
def live(
    procs: Procs, store: str, postgres_url: str | None, tmp_path: Path
) -> Iterator[LoggedServer]:
    server = LoggedServer(
        procs,
        store,
        tmp_path / "troth.db",
        postgres_url,
        ["--retry-timeout", str(RETRY_TIMEOUT)],
    )
    server.start()
    yield server
    assert server.problems() == [], "troth logged errors:\n" + "\n".join(server.problems())


def grants(live: LoggedServer, task: str) -> list[datetime]:
    """When each ``task.acquire`` lease on ``task`` was granted."""
    return [
        stamp(line)
        for line in live.log()
        if (m := GRANT.search(line)) and m[1] == task and m[2] == "task.acquire"
    ]


def metric(live: LoggedServer, name: str) -> float:
    for line in httpx.get(f"{live.url}/metrics", timeout=5).text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return 0.0


def test_a_worker_lacking_the_function_backs_off_and_a_worker_having_it_runs_it(
    node_sdk: NodeSdk, procs: Procs, live: LoggedServer
) -> None:
    task = f"bounce-{uuid.uuid4().hex[:8]}"
    group = "bouncers"
    lacking = procs.start(
        "lacking", node_sdk.program("bounce_ts.mjs", "worker", live.url, group, "lacking")
    )
    procs.wait_line(lacking, r"^worker ready$", RUN_TIMEOUT)
    procs.wait_for("the worker's stream", lambda: metric(live, "troth_sse_connections") >= 1, 30)
    client = procs.start(
        "client", node_sdk.program("bounce_ts.mjs", "start", live.url, task, group)
    )

    procs.wait_for("the first lease", lambda: len(grants(live, task)) >= 1, RUN_TIMEOUT)
    first = grants(live, task)[0]
    time.sleep(BOUNCE_FOR_S)
    in_window = [g for g in grants(live, task) if (g - first).total_seconds() <= BOUNCE_FOR_S]
    assert "is not registered" in lacking.out() + lacking.err()
    assert metric(live, "troth_tasks_in_backoff") == 1
    print(f"{task}: {len(in_window)} task.acquire in {BOUNCE_FOR_S} s of bouncing")
    assert 5 <= len(in_window) <= MAX_ACQUIRES, f"{len(in_window)} leases: no backoff"
    warnings = [line for line in live.log() if "troth.bounces" in line and "WARNING" in line]
    assert len(warnings) == 1, warnings
    assert f"task {task} bounced 3 times" in warnings[0]
    assert f"(group {group})" in warnings[0]
    _, stored = live.call("task.get", {"id": task})
    assert stored["task"]["state"] == "pending"  # nothing lost: still there to run

    lacking.kill()
    leases_before = len(grants(live, task))
    having = procs.start(
        "having", node_sdk.program("bounce_ts.mjs", "worker", live.url, group, "having")
    )
    out = procs.wait_exit(client, RUN_TIMEOUT).splitlines()
    assert out[-1] == f"result -> ran {task}", out
    assert live.promise_value(task) == ("resolved", f"ran {task}")
    _, stored = live.call("task.get", {"id": task})
    assert stored["task"]["state"] == "fulfilled"

    offered = [line for line in live.log() if f"worker of group {group} connected" in line]
    assert len(offered) >= 1, "the held execute was not offered to the new worker"
    lease = grants(live, task)[leases_before]
    waited = (lease - stamp(offered[0])).total_seconds()
    print(f"{task}: leased {waited:.3f} s after the worker having the function connected")
    assert 0 <= waited <= AT_ONCE_S
    assert "is not registered" not in having.out() + having.err()
