"""The peer a user might pick instead of troth on the same database: PgQueuer.

troth's figures on PostgreSQL are easier to judge next to what a PostgreSQL job queue
does on the same server in the same run.  PgQueuer (PyPI ``pgqueuer``) is the one
measured: a job table with ``FOR UPDATE SKIP LOCKED`` dequeues and LISTEN/NOTIFY
wake-ups.  Each measurement runs on a throwaway database of its own (created with
the same admin connection as troth's, dropped after), with PgQueuer's schema
installed by its own ``Queries.install``.

* **single** — each of N producers enqueues one job per transaction
  (``Queries.enqueue`` of one job) and keeps at most ``inflight`` of its jobs not yet
  completed: enough that the consumer never waits for work, few enough that the
  backlog stays bounded, so the figure is a steady state and the latency means
  something.  (A strict closed loop, one job at a time, would measure PgQueuer's
  completion buffer instead: it flushes every 10 completions or 0.1 s.)  The
  consumer is PgQueuer's own ``QueueManager`` (its dequeue batch, completion buffer
  and LISTEN wake-ups as a user gets them) in a process of its own
  (:mod:`troth_bench.pgq_worker`).  The figure is jobs whose completion committed in
  the window, per second; the latency runs from the enqueue's send to the moment the
  completion's commit was reported.
* **batched** — PgQueuer's best case: ``peer_jobs`` jobs enqueued ``peer_batch`` per
  transaction, then drained by a consumer dequeuing ``peer_batch`` at a time in
  ``drain`` mode.  Figures: enqueue jobs/s, drain jobs/s, and jobs over both phases.

Both verify, as troth's workloads do: every job was reported complete exactly once,
the queue is empty after, and the log holds one ``successful`` row per job.

pgqueuer and asyncpg are an optional extra (``pip install -e './bench[pgqueuer]'``,
troth-bench's ``pgqueuer`` extra); they are imported by name so that nothing else in
the lab needs them.
"""

from __future__ import annotations

import asyncio
import importlib
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from troth.plural import counted
from troth_bench.client import BenchFailure
from troth_bench.measure import (
    DbPids,
    Probe,
    Recorder,
    Samples,
    Window,
    machine_busy,
    proc_cpu,
    self_cpu,
)
from troth_bench.options import Options
from troth_bench.pg import as_uri, backend_pids, dbname_of, throwaway
from troth_bench.pgq_worker import ENTRYPOINT
from troth_bench.results import Result, Series

INSTALL = "pip install -e './bench[pgqueuer]'  (or: pip install 'pgqueuer[asyncpg]')"
PAYLOAD = b'{"func":"bench","args":[1],"kwargs":{},"version":1}'


def missing(peer: str) -> str | None:
    """Why ``peer`` cannot be measured here (None: it can), with how to fix it."""
    for module in ("pgqueuer", "asyncpg"):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"--peers {peer} needs {module}, which is not installed ({exc}); {INSTALL}"
    return None


def version() -> str:
    def of(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "?"

    return f"PgQueuer {of('pgqueuer')} (asyncpg {of('asyncpg')})"


class Worker:
    """The consumer process (:mod:`troth_bench.pgq_worker`) and what it reports."""

    def __init__(
        self, dsn: str, batch: int, consumers: int, mode: str, workdir: Path, on_done: Done
    ) -> None:
        self.argv = [
            sys.executable,
            "-m",
            "troth_bench.pgq_worker",
            dsn,
            "--batch",
            str(batch),
            "--consumers",
            str(consumers),
            "--mode",
            mode,
        ]
        self.log_path = workdir / "pgqueuer-worker.log"
        self.on_done = on_done
        self.proc: asyncio.subprocess.Process | None = None
        self.failed: list[str] = []
        self.cpu: float | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self, timeout: float = 60.0) -> None:
        """Spawn and wait for ``ready`` (connected, entrypoint registered)."""
        with open(self.log_path, "ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
            )
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            line = b""
        if line.strip() != b"ready":
            await self.kill()
            raise BenchFailure(f"the PgQueuer worker did not start: {self.tail()}")
        self._reader = asyncio.create_task(self._read())

    def go(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            at = time.perf_counter()
            kind, _, rest = line.decode().strip().partition(" ")
            if kind == "done":
                self.on_done([int(x) for x in rest.split()], at)
            elif kind == "failed":
                self.failed += rest.split()
            elif kind == "cpu":
                self.cpu = float(rest)

    async def wait(self, timeout: float) -> int:
        """Wait for the process to end by itself (drain mode)."""
        assert self.proc is not None
        try:
            code = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            await self.kill()
            raise BenchFailure(f"the PgQueuer worker did not finish: {self.tail()}") from None
        if self._reader is not None:
            await self._reader
        return code

    async def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM: PgQueuer stops dequeuing, finishes its jobs, flushes its buffers."""
        if self.proc is None:
            return 0
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await self.wait(timeout)

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


Done = Callable[[list[int], float], None]


async def stop(worker: Worker, conns: list[Any]) -> None:
    """Close the producers' connections and stop the consumer, which must exit 0."""
    for c in conns:
        await c.close()
    code = await worker.stop()
    if code != 0:
        raise BenchFailure(f"the PgQueuer worker exited with {code}: {worker.tail()}")


async def _install(dsn: str) -> None:
    asyncpg: Any = importlib.import_module("asyncpg")
    pgq: Any = importlib.import_module("pgqueuer")
    conn = await asyncpg.connect(dsn)
    try:
        await pgq.Queries(pgq.AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def _queries(dsn: str, n: int) -> tuple[list[Any], list[Any]]:
    """``n`` producers: PgQueuer ``Queries`` over one asyncpg connection each."""
    asyncpg: Any = importlib.import_module("asyncpg")
    pgq: Any = importlib.import_module("pgqueuer")
    conns = [await asyncpg.connect(dsn) for _ in range(n)]
    return conns, [pgq.Queries(pgq.AsyncpgDriver(c)) for c in conns]


async def _census(dsn: str) -> tuple[int, int, int]:
    """(jobs still queued, successful log rows, jobs logged successful more than once)."""
    asyncpg: Any = importlib.import_module("asyncpg")
    conn = await asyncpg.connect(dsn)
    try:
        queued = await conn.fetchval("SELECT count(*) FROM pgqueuer")
        ok = await conn.fetchval("SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")
        twice = await conn.fetchval(
            "SELECT count(*) FROM (SELECT job_id FROM pgqueuer_log WHERE status = 'successful'"
            " GROUP BY job_id HAVING count(*) > 1) t"
        )
    finally:
        await conn.close()
    return int(queued), int(ok), int(twice)


async def _verify(dsn: str, worker: Worker, reported: Counter[int], expected: int) -> list[str]:
    """Every job completed once: by the worker's reports and by PgQueuer's tables."""
    if worker.failed:
        raise BenchFailure(f"PgQueuer reported failed jobs: {worker.failed[:5]}")
    twice = [j for j, n in reported.items() if n > 1]
    if twice:
        raise BenchFailure(f"PgQueuer completed jobs twice: {twice[:5]}")
    if len(reported) != expected:
        raise BenchFailure(f"PgQueuer: {expected} jobs enqueued, {len(reported)} completed")
    queued, ok, logged_twice = await _census(dsn)
    if queued or ok != expected or logged_twice:
        raise BenchFailure(
            f"PgQueuer tables: {queued} jobs left in the queue, {ok} successful log rows"
            f" for {expected} jobs, {logged_twice} jobs logged twice"
        )
    return [
        f"{expected:,} jobs each reported complete once; queue empty;"
        f" {ok:,} successful log rows, none twice"
    ]


def _pids(base: str, dsn: str) -> DbPids:
    return lambda: backend_pids(base, [dbname_of(dsn)])


class DbCpu:
    """CPU of PostgreSQL's processes over a phase whose end is not known in advance
    (a drain): read every 0.1 s, so a backend that exits with its client (the
    worker's, at the end of the drain) still counts up to its last reading."""

    def __init__(self, pids: DbPids) -> None:
        self.pids = pids
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}

    async def sample(self) -> None:
        for pid in await asyncio.to_thread(self.pids):
            cpu = proc_cpu(pid)
            if cpu is not None:
                self.first.setdefault(pid, cpu)
                self.last[pid] = cpu

    async def follow(self) -> None:
        await asyncio.sleep(0.05)
        await self.sample()  # connections the consumer opened once it started
        while True:
            await asyncio.sleep(0.1)
            for pid in self.first:
                cpu = proc_cpu(pid)
                if cpu is not None:
                    self.last[pid] = cpu

    def spent(self) -> float:
        return sum(self.last[p] - self.first[p] for p in self.first)


async def single(
    base: str, opts: Options, producers: int, consumers: int, workdir: Path, inflight: int = 4
) -> Result:
    """N producers, one job per enqueue transaction, each with at most ``inflight`` jobs
    not yet completed; the consumer drains them as they come."""
    with throwaway(base, "troth_bench_pgq") as conninfo:
        dsn = as_uri(conninfo)
        await _install(dsn)
        early: dict[int, float] = {}  # completions reported before enqueue returned
        pending: dict[int, tuple[float, asyncio.Semaphore]] = {}
        reported: Counter[int] = Counter()
        drained = asyncio.Event()
        window = Window(opts.warmup, opts.duration)
        rec = Recorder(window)

        def on_done(ids: list[int], at: float) -> None:
            for id in ids:
                reported[id] += 1
                entry = pending.pop(id, None)
                if entry is None:
                    early[id] = at
                    continue
                rec.add("jobs", at - entry[0], at)
                entry[1].release()
            if not pending:
                drained.set()

        # PgQueuer's default dequeue batch (10): the consumer as a user runs it.
        worker = Worker(dsn, 10, consumers, "continuous", workdir, on_done)
        await worker.start()
        conns, queries = await _queries(dsn, producers)
        enqueued = [0]
        try:
            worker.go()
            window.start()
            probe = Probe(window, worker.pid, db_pids=_pids(base, dsn))
            probe.start()

            async def producer(q: Any) -> None:
                slots = asyncio.Semaphore(inflight)
                while window.running:
                    await slots.acquire()
                    started = time.perf_counter()
                    ids = await q.enqueue(ENTRYPOINT, PAYLOAD)
                    committed = time.perf_counter()
                    enqueued[0] += 1
                    rec.add("enqueue", committed - started, committed)
                    id = int(ids[0])
                    at = early.pop(id, None)
                    if at is None:
                        drained.clear()
                        pending[id] = (started, slots)
                    else:
                        rec.add("jobs", at - started, at)
                        slots.release()

            try:
                await asyncio.gather(*(producer(q) for q in queries))
            except BaseException:
                probe.cancel()
                raise
            if pending:
                try:
                    await asyncio.wait_for(drained.wait(), opts.op_timeout)
                except TimeoutError:
                    raise BenchFailure(
                        f"{len(pending)} PgQueuer jobs not completed within"
                        f" {opts.op_timeout:.0f} s of the window's end"
                    ) from None
            await probe.finish()
        finally:
            await stop(worker, conns)
        seconds = window.duration
        result = Result(
            "pgqueuer single",
            "jobs",
            [
                Series.of("jobs", "job", rec.series.get("jobs", Samples()), seconds),
                Series.of("enqueue", "txn", rec.series.get("enqueue", Samples()), seconds),
            ],
            cpu=probe.cpu,
            rss_max=probe.rss_max,
            peer="pgqueuer",
            context=counted(producers, "producer"),
        )
        result.checks += await _verify(dsn, worker, reported, enqueued[0])
        result.notes.append(
            f"{version()}; each producer enqueues 1 job per transaction, at most {inflight}"
            f" not yet completed; consumer: {consumers} QueueManager (dequeue batch 10),"
            " own process"
        )
        result.notes.append(
            "jobs = completions committed in the window; latency = enqueue sent → completion"
            " committed (reported by the consumer)"
        )
        return result


async def batched(base: str, opts: Options, workdir: Path) -> Result:
    """``peer_jobs`` enqueued ``peer_batch`` per transaction, then drained in batches."""
    total, size = opts.peer_jobs, opts.peer_batch
    with throwaway(base, "troth_bench_pgq") as conninfo:
        dsn = as_uri(conninfo)
        await _install(dsn)
        reported: Counter[int] = Counter()
        last = [0.0]

        def on_done(ids: list[int], at: float) -> None:
            for id in ids:
                reported[id] += 1
            last[0] = at

        worker = Worker(dsn, size, 1, "drain", workdir, on_done)
        await worker.start()
        conns, (q, *_) = await _queries(dsn, 1)
        enqueue = Samples()
        try:
            t0 = time.perf_counter()
            for start in range(0, total, size):
                n = min(size, total - start)
                began = time.perf_counter()
                await q.enqueue([ENTRYPOINT] * n, [PAYLOAD] * n, [0] * n)
                enqueue.add(time.perf_counter() - began)
            enqueued = time.perf_counter() - t0
        finally:
            for c in conns:
                await c.close()
        db = DbCpu(_pids(base, dsn))
        await db.sample()
        g0, m0 = self_cpu(), machine_busy()
        go = time.perf_counter()
        worker.go()
        sampling = asyncio.create_task(db.follow())
        try:
            code = await worker.wait(opts.op_timeout + total / 100)
        finally:
            sampling.cancel()
        g1, m1 = self_cpu(), machine_busy()
        if code != 0:
            raise BenchFailure(f"the PgQueuer worker exited with {code}: {worker.tail()}")
        drained = max(last[0] - go, 1e-9)
        result = Result(
            "pgqueuer batched",
            "drain",
            [
                Series("drain", "job", len(reported), drained),
                Series("enqueue", "job", total, enqueued, enqueue.percentiles()),
                Series("both phases", "job", total, enqueued + drained),
            ],
            peer="pgqueuer",
            context=f"batches of {size}",
        )
        spent = time.perf_counter() - go
        if worker.cpu is not None:
            result.cpu.server_loop = worker.cpu / spent  # the whole worker process
            result.cpu.server_other = 0.0
        result.cpu.generator = (g1 - g0) / spent
        if m0 is not None and m1 is not None:
            result.cpu.machine = (m1 - m0) / spent
        result.cpu.database = db.spent() / spent
        result.checks += await _verify(dsn, worker, reported, total)
        result.notes.append(
            f"{version()}; {total:,} jobs enqueued {size} per transaction on one connection,"
            f" then drained by 1 QueueManager dequeuing {size} at a time (drain mode)"
        )
        result.notes.append(
            "enqueue latency is per transaction; drain = go → last completion reported;"
            " CPU figures are over the drain"
        )
        return result
