"""What the bench measures with: the measurement window, latency samples, CPU and RSS.

Each workload runs a warm-up, then a window of fixed length; only operations that
*finish* inside the window count, both for the rate and for the latencies, so
connection set-up, cold caches and the drain at the end do not skew either.

CPU is read from ``/proc`` per thread for the server (its event-loop thread and the
rest, which is the SQLite writer) and from ``getrusage`` for the generator itself:
a figure taken while the generator was saturated is a bound on the generator, and
the table says so.
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class Window:
    """The measured interval: ``warmup`` seconds after :meth:`start`, for ``duration``."""

    def __init__(self, warmup: float, duration: float) -> None:
        self.warmup = warmup
        self.duration = duration
        self.begin = 0.0
        self.end = 0.0

    def start(self) -> None:
        now = time.perf_counter()
        self.begin = now + self.warmup
        self.end = self.begin + self.duration

    @property
    def running(self) -> bool:
        """True until the window closed: clients stop starting new operations then."""
        return time.perf_counter() < self.end

    def inside(self, finished: float) -> bool:
        return self.begin <= finished <= self.end


@dataclass
class Samples:
    """Latencies (seconds) of the operations of one name that finished in the window."""

    values: list[float] = field(default_factory=list)

    def add(self, seconds: float) -> None:
        self.values.append(seconds)

    def percentiles(self) -> dict[str, float]:
        """p50/p90/p99/max in milliseconds (nearest rank), empty when nothing finished."""
        if not self.values:
            return {}
        ordered = sorted(self.values)
        n = len(ordered)

        def rank(q: float) -> float:
            return ordered[min(n - 1, max(0, int(q * n + 0.999999) - 1))] * 1000

        return {"p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99), "max": ordered[-1] * 1000}


class Recorder:
    """Named latency series, filled only with operations that finished in the window."""

    def __init__(self, window: Window) -> None:
        self.window = window
        self.series: dict[str, Samples] = defaultdict(Samples)

    def add(self, name: str, seconds: float, finished: float | None = None) -> None:
        if self.window.inside(time.perf_counter() if finished is None else finished):
            self.series[name].add(seconds)

    def count(self, name: str) -> int:
        return len(self.series[name].values) if name in self.series else 0


# -- processes ----------------------------------------------------------------------------


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` (None when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def proc_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of process ``pid``, every thread; None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of every thread of ``pid``, by thread id."""
    out: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


def machine_busy() -> float | None:
    """CPU seconds the whole machine spent busy so far (every CPU, every process)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / TICKS


async def wait_quiet(limit: float, threshold: float = 0.15) -> float | None:
    """Wait (at most ``limit`` seconds) for a second in which the machine, the bench
    and its idle server included, kept less than ``threshold`` cores busy.  Returns
    the seconds waited, or None when it never became quiet."""
    started = time.perf_counter()
    while True:
        b0, t0 = machine_busy(), time.perf_counter()
        await asyncio.sleep(1.0)
        b1, t1 = machine_busy(), time.perf_counter()
        if b0 is None or b1 is None:
            return 0.0
        if (b1 - b0) / (t1 - t0) < threshold:
            return t1 - started
        if t1 - started >= limit:
            return None


def self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclass
class CpuShare:
    """Cores used over the window: the server's event-loop thread, its other threads
    (the SQLite writer; executor threads are idle), and the generator process."""

    server_loop: float | None = None
    server_other: float | None = None
    generator: float = 0.0
    machine: float | None = None  # every process on the machine, these included
    #: PostgreSQL's processes working for the run (its backends, WAL writer, …):
    #: part of the system under test, not noise.  None without PostgreSQL.
    database: float | None = None

    @property
    def elsewhere(self) -> float | None:
        """Cores busy with something else than the server, its database and the
        generator: other load on the machine, which that window's figures suffered from."""
        if self.machine is None or self.server is None:
            return None  # an external server's CPU cannot be told from other load
        return max(0.0, self.machine - self.server - self.generator - (self.database or 0.0))

    @property
    def server(self) -> float | None:
        if self.server_loop is None or self.server_other is None:
            return None
        return self.server_loop + self.server_other


Snapshot = Callable[[], Awaitable[dict[str, float]]]
#: The PostgreSQL processes to charge to the run, asked for at the window's start.
DbPids = Callable[[], list[int]]


def _rss(pids: Sequence[int]) -> int | None:
    values = [v for v in (rss_bytes(p) for p in pids) if v is not None]
    return sum(values) if values else None


class Probe:
    """Samples CPU (and the server's counters, through ``snapshot``) at the window's
    edges, and RSS during it (every ``every`` seconds).

    ``pid`` is the server's, or the list of every node's when several troth processes
    share the work: their CPU and RSS are summed (event-loop threads apart from the
    rest), since together they are the server under test."""

    def __init__(
        self,
        window: Window,
        pid: int | Sequence[int] | None,
        *,
        snapshot: Snapshot | None = None,
        every: float = 0.2,
        db_pids: DbPids | None = None,
    ) -> None:
        self.window = window
        self.pids: list[int] = [] if pid is None else [pid] if isinstance(pid, int) else list(pid)
        self.db_pids = db_pids
        self.snapshot = snapshot
        self.every = every
        self.cpu = CpuShare()
        self.rss_max: int | None = None
        self.snapshots: tuple[dict[str, float], dict[str, float]] = ({}, {})
        self.seconds = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def finish(self) -> None:
        """Wait for the window's closing sample (the task ends with the window)."""
        if self._task is not None:
            await self._task

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        await asyncio.sleep(max(0.0, self.window.begin - time.perf_counter()))
        # The processes' CPU first, at the window's edge: the snapshot (a request to each
        # node) can take longer than a tiny run's whole window on a busy machine, and
        # the window's CPU read after it measured nothing.
        t0, g0, m0 = time.perf_counter(), self_cpu(), machine_busy()
        s0 = {p: thread_cpu(p) for p in self.pids}
        before = await self.snapshot() if self.snapshot is not None else {}
        db = await asyncio.to_thread(self.db_pids) if self.db_pids is not None else []
        d0 = {p: proc_cpu(p) for p in db}
        while time.perf_counter() < self.window.end:
            rss = _rss(self.pids)
            if rss is not None and (self.rss_max is None or rss > self.rss_max):
                self.rss_max = rss
            await asyncio.sleep(min(self.every, max(0.0, self.window.end - time.perf_counter())))
        t1, g1, m1 = time.perf_counter(), self_cpu(), machine_busy()
        s1 = {p: thread_cpu(p) for p in self.pids}
        d1 = {p: proc_cpu(p) for p in db}
        after = await self.snapshot() if self.snapshot is not None else {}
        self.snapshots = (before, after)
        seconds = max(t1 - t0, 1e-9)
        self.seconds = seconds
        self.cpu.generator = (g1 - g0) / seconds
        if m0 is not None and m1 is not None:
            self.cpu.machine = (m1 - m0) / seconds
        if self.pids:
            loop = other = 0.0
            for p in self.pids:
                a, b = s0[p], s1[p]
                loop += b.get(p, 0.0) - a.get(p, 0.0)
                other += sum(v - a.get(t, 0.0) for t, v in b.items() if t != p)
            self.cpu.server_loop = loop / seconds
            self.cpu.server_other = other / seconds
        if db:
            spent = 0.0
            for p in db:
                x, y = d0.get(p), d1.get(p)
                if x is not None and y is not None:
                    spent += y - x
            self.cpu.database = spent / seconds
