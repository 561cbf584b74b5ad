"""The published Resonate SDKs, unmodified, against a real ``troth serve`` process.

Everything else in the suite checks troth against the specification; this file
checks it against the clients people actually run: ``resonate-sdk`` 0.8.1 (Python
3.12) and ``@resonatehq/sdk`` 0.11.5 (Node), over real sockets, with the server in
its own process on a SQLite file, so that killing it (or a worker) is a real crash.

The environments are built once and cached (see ``helpers.sdk_env``); each test starts its
own server on a fresh database and a free port, so tests share no state and the
Python and TypeScript ``workers`` groups never meet.  Expected outputs are the
exact lines the example programs print in the SDKs' own in-process mode
(SDK-CLIENTS.md §6, §7).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from helpers.sdk_env import EXAMPLE_PY, EXAMPLE_TS, NodeSdk, Proc, Procs, PythonSdk
from helpers.troth_process import TrothProcess

pytestmark = pytest.mark.timeout(180)

#: Re-dispatch pending tasks every second rather than every five, so a task whose
#: lease ran out is handed to another worker quickly.
RETRY_TIMEOUT_MS = 1000
#: The lease the recovery workers ask for; they heartbeat every ttl/2.
WORKER_TTL_S = 2
#: How long slow_square holds its task: long enough to be killed mid-run.
WORK_S = 3
#: Bound on any one SDK program; normal runs take 1-2 s.
RUN_TIMEOUT = 60.0


class TrothServer(TrothProcess):
    """``troth serve`` as a child process that can be killed and restarted in place."""

    def __init__(self, procs: Procs, db: Path) -> None:
        super().__init__(procs, "server")
        self.db = db
        self.generation = 0

    def start(self) -> None:
        """Start (again) on the same port and file; return once GET /ready answers 200."""
        self.generation += 1
        argv = [
            *[sys.executable, "-m", "troth.cli.main", "serve"],
            *["--host", "127.0.0.1", "--port", str(self.port)],
            *["--store", "sqlite", "--db", str(self.db)],
            *["--retry-timeout", str(RETRY_TIMEOUT_MS), "--log-level", "info"],
        ]
        self.proc = self.procs.start(f"server-{self.generation}", argv)
        self.down = False
        self.procs.wait_for("GET /ready", self.ready, 30)

    def problems(self) -> list[str]:
        """Error-level log lines and tracebacks the server wrote in any generation."""
        bad: list[str] = []
        for p in self.procs.all:
            if not p.name.startswith("server-"):
                continue
            lines = p.err().splitlines()
            for i, line in enumerate(lines):
                if line.startswith("Traceback"):
                    # name the exception: the first unindented line after the frames
                    last = next((x for x in lines[i + 1 :] if not x.startswith(" ")), "?")
                    bad.append(f"{p.name}: {line} ... {last}")
                elif " ERROR " in line or " CRITICAL " in line or "Exception in" in line:
                    bad.append(f"{p.name}: {line}")
        return bad


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """Children of one test; all killed at teardown, their logs printed then.

    pytest shows teardown output only in a failed test's report, so a green run
    stays quiet while a red one carries every process's stdout and stderr.
    """
    group = Procs(tmp_path)
    try:
        yield group
    finally:
        group.close()
        print(f"\nlogs of this test: {group.logs}\n{group.report()}")


@pytest.fixture
def live(procs: Procs, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[TrothServer]:
    """A fresh ``troth serve`` per test; after the test, its log must hold no errors.

    A worker thread that dies (or a delivery loop that keeps failing) may not make
    the SDK run fail outright, only slower, so the server's own log is checked too.
    """
    failed_before = request.session.testsfailed
    srv = TrothServer(procs, tmp_path / "troth.db")
    srv.start()
    yield srv
    problems = srv.problems()
    if problems:
        summary = "troth logged errors:\n" + "\n".join(problems[:40])
        if request.session.testsfailed > failed_before:
            print(summary)  # the test already failed: say why, but don't fail twice
        else:
            procs.fail(summary)


def assert_output(proc: Proc, expected: list[str], elapsed: str) -> None:
    """Exactly ``expected`` in order, then one ``elapsed`` line matching ``elapsed``."""
    lines = proc.out().splitlines()
    assert lines[:-1] == expected, f"{proc.name} printed:\n{proc.out()}\n{proc.err()}"
    assert re.fullmatch(elapsed, lines[-1]), f"{proc.name} printed:\n{proc.out()}"


def test_python_example(python_sdk: PythonSdk, procs: Procs, live: TrothServer) -> None:
    """The Python example: child call, durable sleep, fan-out, rpc fan-out to a worker
    process, top-level rpc, and a re-run of a finished id (idempotency)."""
    worker = procs.start("py-worker", python_sdk.program("example.py", "worker", "--url", live.url))
    procs.wait_line(worker, r"^worker listening", 30)
    client = procs.start("py-client", python_sdk.program("example.py", "client", "--url", live.url))
    procs.wait_exit(client, RUN_TIMEOUT + 10)
    assert_output(client, EXAMPLE_PY, r"elapsed \d+\.\d+s")


def test_python_api(python_sdk: PythonSdk, procs: Procs, live: TrothServer) -> None:
    """The SDK's promise and schedule clients: the requests workflows never send."""
    api = procs.start("py-api", python_sdk.program("example_api.py", "--url", live.url))
    out = procs.wait_exit(api, RUN_TIMEOUT).splitlines()
    expected = [
        r"create  -> ext-[0-9a-f]{6} pending",
        r"get     -> pending",
        r"resolve -> resolved",
        r"handle  -> ok",
        r"reject  -> rejected",
        r"cancel  -> rejected_canceled",
        r"missing -> ServerError server error \(code=404\): .+",
        r"schedule-> \*/5 \* \* \* \*",
        r"deleted schedule",
    ]
    assert len(out) == len(expected), "\n".join(out)
    for line, pattern in zip(out, expected, strict=True):
        assert re.fullmatch(pattern, line), f"{line!r} !~ {pattern!r}\n" + "\n".join(out)


def test_typescript_example(node_sdk: NodeSdk, procs: Procs, live: TrothServer) -> None:
    """The TypeScript example (strict response guards), then the same ids again:
    the second run must return the stored results."""
    worker = procs.start("ts-worker", node_sdk.program("example_ts.mjs", "worker", live.url))
    procs.wait_line(worker, r"^worker on ", 30)
    suffix = f"ts{int(time.time())}"
    for run in (1, 2):
        client = procs.start(
            f"ts-client-{run}", node_sdk.program("example_ts.mjs", "client", live.url, suffix)
        )
        procs.wait_exit(client, RUN_TIMEOUT + 10)
        assert_output(client, EXAMPLE_TS, r"elapsed \d+(\.\d+)?s")


def test_worker_killed_task_moves_to_other_worker(
    python_sdk: PythonSdk, procs: Procs, live: TrothServer
) -> None:
    """SIGKILL the worker that holds a task mid-run: once its lease (ttl 2 s) runs
    out the task must go to the other worker of the group, and the workflow that
    awaits it must complete with the right value."""
    workers = {
        name: procs.start(
            f"worker-{name}",
            python_sdk.program(
                "recovery.py",
                *["worker", "--url", live.url, "--name", name],
                *["--ttl", str(WORKER_TTL_S), "--work", str(WORK_S)],
            ),
        )
        for name in ("A", "B")
    }
    for w in workers.values():
        procs.wait_line(w, r"^worker . ready", 30)
    client = procs.start(
        "relay-client",
        python_sdk.program("recovery.py", "relay", "--url", live.url, "--id", "relay-1"),
    )

    def holder() -> str | None:
        return next((n for n, w in workers.items() if "START" in w.out()), None)

    procs.wait_for("a worker to START slow_square", lambda: holder() is not None, 30)
    victim = holder()
    assert victim is not None
    workers[victim].kill()
    killed_at = time.time()
    survivor = workers["B" if victim == "A" else "A"]

    procs.wait_exit(client, RUN_TIMEOUT)
    assert client.out().splitlines() == ["relay -> 50"], client.out()
    assert "DONE" not in workers[victim].out()
    starts = procs.wait_line(survivor, r"^START slow_square\(7\)", 5)
    started_at = float(starts[0].rsplit(" at ", 1)[1])
    # The survivor may only start once the victim is gone: the lease is exclusive.
    assert started_at >= killed_at - 0.2, (started_at, killed_at)
    print(f"task moved {started_at - killed_at:.2f} s after the kill")

    assert live.promise_value("relay-1") == ("resolved", 50)
    assert live.promise_value("relay-1:1") == ("resolved", 49)


def test_server_killed_mid_sleep(python_sdk: PythonSdk, procs: Procs, live: TrothServer) -> None:
    """SIGKILL the server while three workflows sleep durably, restart it on the
    same file and port: the SDKs retry, the timers fire from the store, and every
    workflow completes.  A second crash after completion must lose nothing: a
    re-run returns the stored results without executing anything."""
    worker = procs.start(
        "worker", python_sdk.program("recovery.py", "worker", "--url", live.url, "--name", "W")
    )
    procs.wait_line(worker, r"^worker W ready", 30)
    nap = ["nap", "--url", live.url, "--suffix", "k", "--count", "3", "--sleep", "2"]
    client = procs.start("nap-client", python_sdk.program("recovery.py", *nap))
    for i in range(3):
        procs.wait_line(client, rf"^napping {i}$", 30)

    def sleeps_stored() -> bool:
        try:
            timers = [live.call("promise.get", {"id": f"nap-k-{i}:2"}, 2) for i in range(3)]
        except httpx.HTTPError:
            return False  # a wedged server is reported by its sentinel
        return all(status == 200 for status, _ in timers)

    # Crash only once the three timer promises are committed: the sleeps are then
    # the server's to wake, and they are still pending (2 s have not passed).
    procs.wait_for("the three durable sleeps to be stored", sleeps_stored, 30)
    live.kill()
    down_at = time.monotonic()
    time.sleep(1.0)
    live.start()
    procs.wait_exit(client, RUN_TIMEOUT)
    print(f"completed {time.monotonic() - down_at:.2f} s after the crash")
    results = [line for line in client.out().splitlines() if not line.startswith("napping")]
    assert results == ["nap 0 -> 0", "nap 1 -> 1", "nap 2 -> 4"], client.out()
    for i in range(3):
        assert live.promise_value(f"nap-k-{i}") == ("resolved", i * i)
        assert live.promise_value(f"nap-k-{i}:2")[0] == "resolved"  # the durable sleep

    live.kill()
    live.start()
    again = procs.start("nap-again", python_sdk.program("recovery.py", *nap))
    procs.wait_exit(again, RUN_TIMEOUT)
    assert again.out().splitlines() == ["nap 0 -> 0", "nap 1 -> 1", "nap 2 -> 4"], again.out()
