"""A task that keeps bouncing backs off, with the published SDKs
(docs/protocol.md, "Tasks that keep bouncing back off").

A worker of the group that lacks the function (``tests/sdk/bounce_ts.mjs worker …
lacking``, ``tests/sdk/bounce.py worker --kind lacking``) answers every ``execute``
for it with "is not registered. Will drop." (TypeScript) or "function not found"
(Python) and a ``task.release``; a *poison* worker (``bounce.py --kind poison``) has
the function but every replay of it fails inside the SDK after a durable step (its
result cannot be encoded), and the SDK releases the task.  Before the backoff troth
re-offered such a task at once and the same worker took it again, one cycle every few
milliseconds for as long as it ran.  Now (docs/protocol.md, "Tasks that keep
bouncing") the bounce rate falls to the backoff's (50 ms doubling per bounce, at most
``retry_timeout``), troth warns once naming the task and its group, the metrics count
it, and when a worker that runs the function connects to the group the held
``execute`` goes out at once and the task completes: nothing is lost.

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

from helpers.sdk_env import NodeSdk, Procs, PythonSdk
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


def bounce_then_run(
    procs: Procs,
    live: LoggedServer,
    task: str,
    group: str,
    bouncing: list[str],
    having: list[str],
    client: list[str],
    sign: str,
) -> None:
    """A worker of ``group`` (``bouncing``) bounces ``task`` for ``BOUNCE_FOR_S``: its
    leases fall to the backoff's rate, the warning and the metrics name it, it stays
    pending; then it is killed, a worker that runs the task (``having``) connects and
    is leased at once, and the client's rpc completes.  ``sign`` is what the bouncing
    worker prints on each bounce."""
    worker = procs.start("bouncing", bouncing)
    procs.wait_line(worker, r"^worker ready$", RUN_TIMEOUT)
    procs.wait_for("the worker's stream", lambda: metric(live, "troth_sse_connections") >= 1, 30)
    caller = procs.start("client", client)

    procs.wait_for("the first lease", lambda: len(grants(live, task)) >= 1, RUN_TIMEOUT)
    first = grants(live, task)[0]
    time.sleep(BOUNCE_FOR_S)
    in_window = [g for g in grants(live, task) if (g - first).total_seconds() <= BOUNCE_FOR_S]
    assert sign in worker.out() + worker.err()
    assert metric(live, "troth_tasks_in_backoff") == 1
    assert metric(live, "troth_task_bounces_total") >= len(in_window) - 1
    assert metric(live, "troth_task_backoffs_total") >= 1
    print(f"{task}: {len(in_window)} task.acquire in {BOUNCE_FOR_S} s of bouncing")
    assert 5 <= len(in_window) <= MAX_ACQUIRES, f"{len(in_window)} leases: no backoff"
    warnings = [line for line in live.log() if "troth.bounces" in line and "WARNING" in line]
    assert len(warnings) == 1, warnings
    assert f"task {task} bounced 3 times" in warnings[0]
    assert f"(group {group})" in warnings[0]
    _, stored = live.call("task.get", {"id": task})
    assert stored["task"]["state"] == "pending"  # nothing lost: still there to run

    # Killed right after a bounce: the hold ahead of its execute is then the longest
    # yet (over 10 s by now), so the new worker connects well before the row would
    # come due by itself, however slowly it starts on a loaded machine.
    bounced = metric(live, "troth_task_bounces_total")
    procs.wait_for(
        "the next bounce", lambda: metric(live, "troth_task_bounces_total") > bounced, 30
    )
    worker.kill()
    leases_before = len(grants(live, task))
    runner = procs.start("having", having)
    out = procs.wait_exit(caller, RUN_TIMEOUT).splitlines()
    assert out[-1] == f"result -> ran {task}", out
    assert live.promise_value(task) == ("resolved", f"ran {task}")
    _, stored = live.call("task.get", {"id": task})
    assert stored["task"]["state"] == "fulfilled"

    offered = [line for line in live.log() if f"worker of group {group} connected" in line]
    assert len(offered) >= 1, "the held execute was not offered to the new worker"
    lease = grants(live, task)[leases_before]
    waited = (lease - stamp(offered[0])).total_seconds()
    print(f"{task}: leased {waited:.3f} s after the worker that runs it connected")
    assert 0 <= waited <= AT_ONCE_S
    assert sign not in runner.out() + runner.err()


def test_a_worker_lacking_the_function_backs_off_and_a_worker_having_it_runs_it(
    node_sdk: NodeSdk, procs: Procs, live: LoggedServer
) -> None:
    task, group = f"bounce-{uuid.uuid4().hex[:8]}", "bouncers"
    bounce_then_run(
        procs,
        live,
        task,
        group,
        node_sdk.program("bounce_ts.mjs", "worker", live.url, group, "lacking"),
        node_sdk.program("bounce_ts.mjs", "worker", live.url, group, "having"),
        node_sdk.program("bounce_ts.mjs", "start", live.url, task, group),
        "is not registered",
    )


def python_program(python_sdk: PythonSdk, live: LoggedServer, *args: str) -> list[str]:
    return python_sdk.program("bounce.py", *args, "--url", live.url)


def test_a_python_worker_lacking_the_function_backs_off_and_one_having_it_runs_it(
    python_sdk: PythonSdk, procs: Procs, live: LoggedServer
) -> None:
    """The same with resonate-sdk 0.8.1, whose worker answers an ``execute`` for a
    function it lacks with "function not found" and a ``task.release``."""
    task, group = f"bounce-py-{uuid.uuid4().hex[:8]}", "bouncers"
    bounce_then_run(
        procs,
        live,
        task,
        group,
        python_program(python_sdk, live, "worker", "--group", group, "--kind", "lacking"),
        python_program(python_sdk, live, "worker", "--group", group, "--kind", "having"),
        python_program(python_sdk, live, "start", "--group", group, "--id", task),
        "function not found",
    )


def test_a_poison_task_that_fails_on_every_replay_backs_off_and_nothing_is_lost(
    python_sdk: PythonSdk, procs: Procs, live: LoggedServer
) -> None:
    """A poison task: the worker has the function, but every run of it — each replay —
    fails inside the SDK after a durable step (its result cannot be encoded, so the
    fulfil never happens) and the SDK releases the task.  Its re-offers fall to the
    backoff's rate, the step's promise stays resolved once (replays do not redo it),
    and a fixed worker runs the task at once."""
    task, group = f"poison-{uuid.uuid4().hex[:8]}", "poisoned"
    bounce_then_run(
        procs,
        live,
        task,
        group,
        python_program(python_sdk, live, "worker", "--group", group, "--kind", "poison"),
        python_program(python_sdk, live, "worker", "--group", group, "--kind", "having"),
        python_program(python_sdk, live, "start", "--group", group, "--id", task),
        "cannot encode object of type Unencodable",
    )
    poison = next(p for p in procs.all if p.name == "bouncing")
    steps = [line for line in poison.out().splitlines() if line == f"replaying {task}"]
    assert len(steps) >= 5, steps  # the poison worker really replayed it, each time
    # The workflow and its one step, both resolved: every replay found the step done.
    _, found = live.call("promise.search", {"tags": {"resonate:origin": task}, "limit": 100})
    states = {p["id"]: p["state"] for p in found["promises"]}
    assert len(states) == 2 and task in states, states
    assert set(states.values()) == {"resolved"}, states
