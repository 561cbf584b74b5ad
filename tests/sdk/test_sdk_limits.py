"""Concurrency limits per worker group (docs/operations.md, "Flow control") with the
published SDKs' workers.

A workflow of the Python or TypeScript SDK (``tests/sdk/limits.py``,
``limits_ts.mjs``, group ``driver``) fans out RPCs to a group of several worker
processes of the same SDK whose group has a limit.  Every step prints when it starts
and ends, before its task is fulfilled, so each printed interval lies within the time
its task held a slot: the most intervals open at once, across all the workers, is a
lower bound of the slots in use, which the limit bounds.  Each test checks the
workflow's result, that the limit was kept, and that it was used (the steps did not
starve below it):

* a limit of 3 set before the run, over a fan-out of 50 steps (both SDKs);
* a limit of 1 raised to 4 in the middle of the run;
* a worker holding every slot killed with SIGKILL: its leases (a short ``ttl``)
  expire, and the slots go to the workers started after it;
* ``task.acquire`` refused (409) by a limit set while workers held ``execute``
  messages they had not acquired yet: each SDK drops the message, logs it, and goes
  on; the refused tasks get their ``execute`` again later and the workflow completes.

``troth serve`` is a child process on SQLite (the stores that keep limits are
SQLite and memory).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from helpers.sdk_env import NodeSdk, Proc, Procs, PythonSdk
from helpers.troth_process import LoggedServer

pytestmark = pytest.mark.timeout(120)

GROUP = "limited"
RUN_TIMEOUT = 45.0
#: The refusal's text (src/troth/flow/gate.py), as both SDKs log it.
REFUSED = "Task is held by the concurrency limit of group"


@pytest.fixture
def store() -> str:
    """SQLite only: it keeps limits; PostgreSQL refuses them (501) for now."""
    return "sqlite"


def start_server(procs: Procs, tmp_path: Path, *extra: str) -> LoggedServer:
    server = LoggedServer(procs, "sqlite", tmp_path / "troth.db", None, list(extra))
    server.start()
    return server


@pytest.fixture(params=["py", "ts"])
def sdk(request: pytest.FixtureRequest) -> Sdk:
    if request.param == "py":
        return Sdk("py", request.getfixturevalue("python_sdk"))
    return Sdk("ts", request.getfixturevalue("node_sdk"))


@dataclass(frozen=True)
class Sdk:
    """Starts the worker and client programs of one SDK."""

    kind: str
    env: PythonSdk | NodeSdk

    def _argv(self, *args: str) -> list[str]:
        name = "limits.py" if self.kind == "py" else "limits_ts.mjs"
        return self.env.program(name, *args)

    def worker(self, procs: Procs, url: str, name: str, *options: str) -> Proc:
        argv = self._argv("worker", "--url", url, "--group", GROUP, "--name", name, *options)
        return procs.start(f"worker-{name}", argv)

    def client(self, procs: Procs, url: str, id: str, steps: int, seconds: float) -> Proc:
        argv = self._argv(
            "client", "--url", url, "--target", GROUP, "--id", id,
            "--steps", str(steps), "--seconds", str(seconds), "--timeout", str(RUN_TIMEOUT),
        )  # fmt: skip
        return procs.start(f"client-{id}", argv)


# --------------------------------------------------------------------------- #
# The server's side
# --------------------------------------------------------------------------- #
def set_limit(url: str, concurrency: int) -> dict[str, object]:
    r = httpx.post(
        f"{url}/ops/limits/set", json={"group": GROUP, "concurrency": concurrency}, timeout=10
    )
    assert r.status_code == 200, r.text
    answer: dict[str, object] = r.json()
    return answer


def wait_connected(procs: Procs, url: str, count: int) -> None:
    """Until ``count`` workers hold a connection to the group (an ``execute`` sent
    before would wait for the retry timer)."""

    def connected() -> bool:
        groups = httpx.get(f"{url}/ops/workers", timeout=5).json()["groups"]
        return any(g["group"] == GROUP and len(g["connections"]) >= count for g in groups)

    procs.wait_for(f"{count} workers of {GROUP} to connect", connected, 20)


class LimitWatch:
    """Polls ``GET /ops/limits`` through the run: the most slots in use and tasks held
    the server reported."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.in_use = 0
        self.held = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                limits = httpx.get(f"{self.url}/ops/limits", timeout=5).json()["limits"]
            except httpx.HTTPError:
                continue
            for limit in limits:
                if limit["group"] == GROUP:
                    self.in_use = max(self.in_use, limit["inUse"])
                    self.held = max(self.held, limit["held"])

    def __enter__(self) -> LimitWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def clean(procs: Procs) -> Iterator[list[LoggedServer]]:
    """Servers appended here must have logged no error (checked at teardown)."""
    servers: list[LoggedServer] = []
    yield servers
    for server in servers:
        assert server.problems() == [], "troth logged errors:\n" + "\n".join(server.problems())


# --------------------------------------------------------------------------- #
# The workers' side: what their steps printed
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Step:
    worker: str
    i: int
    start: float
    #: None: the worker never finished it (it was killed).
    end: float | None


def steps(*workers: Proc) -> list[Step]:
    """Every step the workers started, with its end if it printed one."""
    found: list[Step] = []
    for proc in workers:
        open_: dict[int, Step] = {}
        for line in proc.out().splitlines():
            parts = line.split()
            if len(parts) != 4 or parts[0] not in ("start", "end"):
                continue
            i, at = int(parts[2]), float(parts[3])
            if parts[0] == "start":
                assert i not in open_, f"{proc.name} started step {i} twice at once"
                open_[i] = Step(parts[1], i, at, None)
            else:
                found.append(Step(parts[1], i, open_.pop(i).start, at))
        found += open_.values()
    return sorted(found, key=lambda s: s.start)


def peak(run: list[Step], since: float = 0.0, until: float = float("inf")) -> int:
    """The most steps running at once at any instant in ``[since, until]``; a step
    without an end counts as running from its start on."""
    events: list[tuple[float, int]] = []
    for s in run:
        end = s.end if s.end is not None else float("inf")
        lo, hi = max(s.start, since), min(end, until)
        if lo <= hi:
            events += [(lo, 1), (hi, -1)]
    # an end and a start at the same instant: the end first (the slot was freed)
    events.sort(key=lambda e: (e[0], e[1]))
    running = most = 0
    for _, delta in events:
        running += delta
        most = max(most, running)
    return most


def result_of(procs: Procs, client: Proc) -> int:
    out = procs.wait_exit(client, RUN_TIMEOUT + 10)
    lines = [line for line in out.splitlines() if line.startswith(("result", "error", "gave-up"))]
    assert len(lines) == 1 and lines[0].startswith("result "), out
    return int(lines[0].split()[2])


def squares(n: int) -> int:
    return sum(i * i for i in range(n))


def refusals(proc: Proc) -> list[str]:
    """The worker's log lines of a ``task.acquire`` the limit refused."""
    return [line for line in (proc.out() + proc.err()).splitlines() if REFUSED in line]


# --------------------------------------------------------------------------- #
# The tests
# --------------------------------------------------------------------------- #
FANOUT = 50
STEP_S = 0.2


def test_fanout_keeps_the_limit(
    sdk: Sdk, procs: Procs, tmp_path: Path, clean: list[LoggedServer]
) -> None:
    """50 RPCs of 0.2 s to four workers of a group limited to 3: never more than 3
    steps run at once, 3 do, and the workflow gets every result."""
    live = start_server(procs, tmp_path)
    clean.append(live)
    set_limit(live.url, 3)
    workers = [sdk.worker(procs, live.url, f"w{n}") for n in range(4)]
    wait_connected(procs, live.url, len(workers))
    wf = f"limit-{sdk.kind}-{uuid.uuid4().hex[:8]}"
    began = time.monotonic()
    with LimitWatch(live.url) as watch:
        client = sdk.client(procs, live.url, wf, FANOUT, STEP_S)
        assert result_of(procs, client) == squares(FANOUT)
    took = time.monotonic() - began

    run = steps(*workers)
    assert sorted(s.i for s in run) == list(range(FANOUT)), run
    assert all(s.end is not None for s in run), run
    assert peak(run) == 3, f"most steps at once: {peak(run)}\n{run}"
    assert len({s.worker for s in run}) >= 2, "one worker ran every step"
    assert watch.in_use <= 3, f"the server reported {watch.in_use} slots in use"
    assert watch.held > 0, "the server never held a task"
    assert all(w.alive() for w in workers)
    # At most 3 at once, 50 steps of 0.2 s take at least 50 / 3 x 0.2 s.
    assert took >= FANOUT / 3 * STEP_S
    per_worker = Counter(s.worker for s in run)
    print(
        f"{sdk.kind}: {FANOUT} steps of {STEP_S} s, limit 3, 4 workers: {took:.2f} s "
        f"from the client's start (ideal {FANOUT / 3 * STEP_S:.2f} s); most held {watch.held}; "
        f"steps per worker {sorted(per_worker.items())}; "
        f"task.acquire 409: {live.answered('task.acquire', 409)}"
    )


RAISE_STEPS = 30
BEFORE_RAISE = 5


def test_a_raised_limit_takes_effect_mid_run(
    sdk: Sdk, procs: Procs, tmp_path: Path, clean: list[LoggedServer]
) -> None:
    """A limit of 1 raised to 4 after 5 steps: one step at a time before the raise,
    4 at once after it, and the workflow completes."""
    live = start_server(procs, tmp_path)
    clean.append(live)
    set_limit(live.url, 1)
    workers = [sdk.worker(procs, live.url, f"w{n}") for n in range(5)]
    wait_connected(procs, live.url, len(workers))
    wf = f"raise-{sdk.kind}-{uuid.uuid4().hex[:8]}"
    client = sdk.client(procs, live.url, wf, RAISE_STEPS, STEP_S)

    def ended() -> int:
        return sum(s.end is not None for s in steps(*workers))

    procs.wait_for(f"{BEFORE_RAISE} steps to end", lambda: ended() >= BEFORE_RAISE, RUN_TIMEOUT)
    asked = time.time()
    answer = set_limit(live.url, 4)
    raised = time.time()
    assert answer["concurrency"] == 4
    assert result_of(procs, client) == squares(RAISE_STEPS)

    run = steps(*workers)
    assert sorted(s.i for s in run) == list(range(RAISE_STEPS)), run
    assert peak(run, until=asked) == 1, f"before the raise:\n{run}"
    after = [s for s in run if s.start > asked]
    assert len(after) >= 8, run
    assert peak(run) == 4, f"most steps at once: {peak(run)}\n{run}"
    assert peak(run, since=asked) == 4
    # The held tasks went at once: three more steps started within 1 s of the raise.
    assert sum(s.start < asked + 1.0 for s in after) >= 3, run
    print(
        f"{sdk.kind}: raised 1 -> 4 after {len(run) - len(after)} steps; answered in "
        f"{(raised - asked) * 1000:.0f} ms; the first steps after it start "
        f"{', '.join(f'{(s.start - asked) * 1000:.0f}' for s in after[:4])} ms after it "
        f"was asked; the last ends {max(s.end or 0 for s in run) - asked:.2f} s after"
    )


TTL_S = 3.0
KILL_STEPS = 12


def test_a_killed_workers_slots_go_when_its_leases_expire(
    sdk: Sdk, procs: Procs, tmp_path: Path, clean: list[LoggedServer]
) -> None:
    """The only worker, holding all 3 slots with steps that never end, is SIGKILLed:
    nothing else starts until its leases (ttl 3 s) expire, then the workers started
    after it take the slots, run its steps again, and the workflow completes."""
    live = start_server(procs, tmp_path)
    clean.append(live)
    set_limit(live.url, 3)
    doomed = sdk.worker(procs, live.url, "doomed", "--ttl", str(TTL_S), "--sleep", "600")
    wait_connected(procs, live.url, 1)
    wf = f"kill-{sdk.kind}-{uuid.uuid4().hex[:8]}"
    client = sdk.client(procs, live.url, wf, KILL_STEPS, STEP_S)
    procs.wait_line(doomed, r"^start ", RUN_TIMEOUT, count=3)
    time.sleep(0.5)  # a 4th would start by now if the limit let it
    held = steps(doomed)
    assert len(held) == 3, held
    usage = httpx.get(f"{live.url}/ops/limits", timeout=5).json()["limits"][0]
    assert usage["inUse"] == 3 and usage["held"] == KILL_STEPS - 3, usage
    doomed.kill()
    killed = time.time()
    others = [sdk.worker(procs, live.url, name, "--ttl", str(TTL_S)) for name in ("b", "c")]
    assert result_of(procs, client) == squares(KILL_STEPS)

    run = steps(*others)
    assert sorted(s.i for s in run) == list(range(KILL_STEPS)), run
    # Its leases were taken at its steps' starts at the earliest, and none was renewed
    # after the kill: the first slot came free no sooner than ttl after the first start.
    first = min(s.start for s in run)
    expiry_floor = min(s.start for s in held) + TTL_S - 0.25
    assert first >= expiry_floor, (first - killed, held)
    assert first <= killed + TTL_S + 6.0, first - killed  # a loaded machine is slow
    assert peak(run) == 3, f"most steps at once: {peak(run)}\n{run}"
    print(
        f"{sdk.kind}: killed {killed - min(s.start for s in held):.2f} s after its first "
        f"step started; first step elsewhere {first - killed:.2f} s after the kill "
        f"(ttl {TTL_S} s); done {max(s.end or 0 for s in run) - killed:.2f} s after it"
    )


REFUSED_STEPS = 8


def test_a_refused_acquire_is_dropped_and_the_task_runs_later(
    sdk: Sdk, procs: Procs, tmp_path: Path, clean: list[LoggedServer]
) -> None:
    """A limit of 1 set while a worker holds ``execute`` messages it has not acquired
    yet: the limit refuses their ``task.acquire`` (409), the SDK logs and drops each
    and goes on, the retry timer sends each task again, and the workflow completes
    within the limit.

    Python: one worker that runs at most 2 tasks at once (``max_concurrent_tasks``,
    the SDK's own bound) keeps the other executes waiting unacquired.  TypeScript has
    no such bound; the program delays each ``task.acquire`` by 1 s instead."""
    live = start_server(procs, tmp_path, "--retry-timeout", "1000")
    clean.append(live)
    if sdk.kind == "py":
        worker = sdk.worker(procs, live.url, "w", "--max-tasks", "2", "--sleep", "1")
        waiting = r"^start "
    else:
        worker = sdk.worker(procs, live.url, "w", "--acquire-delay", "1", "--sleep", "0.3")
        waiting = r"^acquire-delayed "
    wait_connected(procs, live.url, 1)
    wf = f"refused-{sdk.kind}-{uuid.uuid4().hex[:8]}"
    client = sdk.client(procs, live.url, wf, REFUSED_STEPS, STEP_S)
    procs.wait_line(worker, waiting, RUN_TIMEOUT, count=2)
    time.sleep(0.3)  # every execute reaches the worker
    set_limit(live.url, 1)
    limited = time.time()
    assert result_of(procs, client) == squares(REFUSED_STEPS)

    refused = live.answered("task.acquire", 409)
    logged = refusals(worker)
    assert refused >= 1 and len(logged) >= 1, (refused, logged)
    assert worker.alive(), "the worker died of a refused task.acquire"
    # Dropped, not retried: a few 409s a task (the limit's, and "not pending" for an
    # execute the retry timer sent again while the first was being acquired).
    assert refused <= 4 * REFUSED_STEPS, f"{refused} task.acquire answered 409"
    run = steps(worker)
    assert sorted({s.i for s in run}) == list(range(REFUSED_STEPS)), run
    # Steps begun after the limit was set ran one at a time (the ones before it run on).
    late = [s for s in run if s.start > limited]
    assert peak(late) == 1, run
    done = max(s.end or 0 for s in run) - limited
    print(
        f"{sdk.kind}: {refused} task.acquire answered 409, {len(logged)} by the limit, "
        f"e.g. {logged[0]!r}; done {done:.2f} s after the limit was set"
    )
