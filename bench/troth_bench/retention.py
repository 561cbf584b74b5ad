"""Does retention keep the store bounded, and what does it cost? (docs/operations.md,
"Retention")

``python -m troth_bench.retention [--seconds 60] [--horizon 10s] [--clients 32]
[--backlog SECONDS]``
runs the same steady workflow load — each workflow a root and three children, all
created and settled, eight requests — against two ``troth serve`` processes on
SQLite (synchronous FULL), one after the other: one with ``--retention`` and one
without (the control).  Every few seconds it samples the database's size (the main
file, the WAL, and the pages in use: ``page_count - freelist_count``) and prints the
series side by side, with the workflows per second each sustained.  A bounded store
shows a flat line after the first horizon; the control grows with the load.

``--backlog S`` measures the other thing an operator meets: S seconds of load
without retention, then the server restarted with ``--retention`` on the same file,
and ``--seconds`` more of the same load while retention catches up, in windows:
workflows per second, request p99 and max, and ``troth_retention_behind_seconds``.
``--mixed`` runs the rest of a busy server's load beside the workflows in both
phases (:mod:`troth_bench.mixed`: lifecycle with SSE workers, and reads), so the
windows also show tasks per second, their p99 and reads per second.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import psycopg

from troth.durations import parse_duration
from troth.plural import counted
from troth_bench import pg
from troth_bench.http import HttpConnection
from troth_bench.measure import proc_cpu
from troth_bench.mixed import Beside
from troth_bench.procs import ServerProcess

_encode = msgspec.json.encode
HOUR = 3_600_000


@dataclass
class Run:
    name: str
    workflows: int = 0
    seconds: float = 0.0
    #: (elapsed s, file MB, WAL MB, MB of pages in use)
    samples: list[tuple[float, float, float, float]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.workflows / self.seconds if self.seconds else 0.0


def envelope(kind: str, data: dict[str, object], corr: str) -> bytes:
    return _encode({"kind": kind, "head": {"corrId": corr, "version": "2026-04-01"}, "data": data})


async def client(
    port: int, prefix: str, stop: float, run: Run, windows: Windows | None = None
) -> None:
    conn = await HttpConnection.open("127.0.0.1", port)
    try:
        for n in itertools.count():
            if time.monotonic() >= stop:
                return
            root = f"{prefix}-{n}"
            far = time.time_ns() // 1_000_000 + HOUR
            bodies = [
                envelope(
                    "promise.create", {"id": root, "timeoutAt": far, "param": {}, "tags": {}}, root
                )
            ]
            for c in range(3):
                tags = {"resonate:origin": root, "resonate:parent": root}
                child = f"{root}.{c}"
                bodies.append(
                    envelope(
                        "promise.create",
                        {"id": child, "timeoutAt": far, "param": {}, "tags": tags},
                        child,
                    )
                )
                bodies.append(
                    envelope(
                        "promise.settle", {"id": child, "state": "resolved", "value": {}}, child
                    )
                )
            bodies.append(
                envelope("promise.settle", {"id": root, "state": "resolved", "value": {}}, root)
            )
            for body in bodies:
                began = time.perf_counter()
                status, answer = await conn.post(body)
                if status != 200:
                    raise RuntimeError(f"{status}: {answer[:200]!r}")
                if windows is not None:
                    windows.request(time.perf_counter() - began)
            run.workflows += 1
            if windows is not None:
                windows.workflows += 1
    finally:
        conn.close()


@dataclass
class Window:
    """One window of a backlog run: its phase, workflows per second, request latency
    (p99 and max, ms), how far behind retention said it was at its end (s), and the
    server's CPU per workflow (ms, every thread; None where /proc is not).  On a
    machine whose other work takes a varying share of the CPU, the rate drifts with
    it; CPU per workflow says what the server itself spent."""

    phase: str
    rate: float
    p99: float
    max: float
    behind: float | None
    cpu_ms: float | None = None
    #: ``--mixed``: lifecycle tasks per second, their request p99 (ms), reads per second.
    beside: tuple[float, float, float] | None = None


@dataclass
class Windows:
    """Counts of the window under way (the clients add to it)."""

    workflows: int = 0
    latencies: list[float] = field(default_factory=list)

    def request(self, seconds: float) -> None:
        self.latencies.append(seconds)

    def close(
        self, phase: str, seconds: float, behind: float | None, cpu: float | None = None
    ) -> Window:
        """The window's figures; ``cpu``: the server's CPU seconds during it."""
        ordered = sorted(self.latencies) or [0.0]
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        w = Window(phase, self.workflows / seconds, p99 * 1000, ordered[-1] * 1000, behind)
        if cpu is not None and self.workflows:
            w.cpu_ms = cpu * 1000 / self.workflows
        self.workflows, self.latencies = 0, []
        return w


async def behind_seconds(port: int) -> float | None:
    """``troth_retention_behind_seconds`` from the server's /metrics (None: none)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
        await writer.drain()
        text = (await reader.read()).decode(errors="replace")
    finally:
        writer.close()
    for line in text.splitlines():
        if line.startswith("troth_retention_behind_seconds "):
            return float(line.split()[1])
    return None


async def backlog_phase(
    server: ServerProcess,
    phase: str,
    seconds: float,
    args: argparse.Namespace,
    first: bool,
) -> list[Window]:
    """``--clients`` steady workflow clients for ``seconds`` (with ``--mixed``,
    lifecycle and reads beside them), measured in windows of ``--window``."""
    await server.start()
    run, current, out = Run(phase), Windows(), []
    beside = None
    try:
        if args.mixed:
            beside = await Beside.open(
                server, args.lifecycle_clients, args.workers, args.reads_clients, seed=first
            )
        began = time.monotonic()
        stop = began + seconds
        load = [
            asyncio.create_task(client(server.port, f"{phase}{k}-", stop, run, current))
            for k in range(args.clients)
        ]
        if beside is not None:
            beside.start(stop)
        mark, spent = began, proc_cpu(server.pid)
        while time.monotonic() + args.window <= stop + 0.5:
            await asyncio.sleep(mark + args.window - time.monotonic())
            now, cpu = time.monotonic(), proc_cpu(server.pid)
            behind = await behind_seconds(server.port)
            used = cpu - spent if cpu is not None and spent is not None else None
            out.append(current.close(phase, now - mark, behind, used))
            if beside is not None:
                out[-1].beside = beside.close(now - mark)
            print(_window_line(len(out), out[-1]), flush=True)
            mark, spent = now, cpu
        await asyncio.gather(*load)
        if beside is not None:
            await beside.finish()
    finally:
        server.kill()
    return out


def _window_line(n: int, w: Window) -> str:
    behind = "-" if w.behind is None else f"{w.behind:.0f}"
    cpu = "-" if w.cpu_ms is None else f"{w.cpu_ms:.2f}"
    line = f"{n:3} {w.phase:18} {w.rate:9,.0f} {w.p99:8.1f} {w.max:8.1f} {behind:>8}"
    line = f"{line} {cpu:>9}"
    if w.beside is not None:
        tasks, p99, reads = w.beside
        line = f"{line} {tasks:9,.0f} {p99:8.1f} {reads:9,.0f}"
    return line


def _mixed_verdict(without: list[Window], with_: list[Window]) -> None:
    """``--mixed``: the worst window with retention against the median without, for
    lifecycle's tasks, their p99 and the reads."""
    base = [w.beside for w in without[1:] or without if w.beside is not None]
    held = [w.beside for w in with_ if w.beside is not None]
    if not base or not held:
        return
    for k, name, unit in ((0, "lifecycle", "tasks/s"), (2, "reads", "reads/s")):
        median = sorted(b[k] for b in base)[len(base) // 2]
        worst = min(h[k] for h in held)
        print(
            f"{name}: worst window with retention {worst:,.0f} {unit} = {worst / median:.2f}x"
            f" the median without ({median:,.0f})"
        )
    p99 = sorted(b[1] for b in base)[len(base) // 2]
    most = max(h[1] for h in held)
    print(f"lifecycle p99: at most {most:.1f} ms with retention = {most / p99:.2f}x ({p99:.1f})")


async def backlog(args: argparse.Namespace) -> int:
    """The operator's day: a store run without retention for ``--backlog`` seconds,
    then restarted with ``--retention HORIZON`` on the same file (a backlog of
    ``backlog - horizon`` seconds of workflows) and run ``--seconds`` more under the
    same load.  The ratio of the worst window with retention to the median window
    without it says what catching up costs the foreground."""
    with tempfile.TemporaryDirectory(prefix="troth-retention-") as tmp:
        work = Path(tmp)
        db = work / "backlog.db"
        extra = ["--retention", args.horizon, "--retention-interval", "1"]
        print(f"steady load: {counted(args.clients, 'client')}, workflows of 4 promises")
        head = f"{'#':>3} {'phase':18} {'wf/s':>9} {'p99 ms':>8} {'max ms':>8} {'behind s':>8}"
        head = f"{head} {'cpu ms/wf':>9}"
        if args.mixed:
            print(
                f"beside them: lifecycle, {counted(args.lifecycle_clients, 'client')} and"
                f" {counted(args.workers, 'SSE worker')}; reads,"
                f" {counted(args.reads_clients, 'client')}"
            )
            head = f"{head} {'tasks/s':>9} {'task p99':>8} {'reads/s':>9}"
        print(head)
        plain = ServerProcess.troth(work / "a", db, synchronous="full")
        without = await backlog_phase(plain, "without retention", args.backlog, args, True)
        kept = ServerProcess.troth(work / "b", db, synchronous="full", extra=extra)
        with_ = await backlog_phase(kept, "with retention", args.seconds, args, False)
    base = sorted(w.rate for w in without[1:] or without)
    median = base[len(base) // 2]
    p99s = sorted(w.p99 for w in without[1:] or without)
    p99 = p99s[len(p99s) // 2]
    worst = min(with_, key=lambda w: w.rate)
    print(
        f"worst window with retention: {worst.rate:,.0f} wf/s = {worst.rate / median:.2f}x the"
        f" median without ({median:,.0f}); p99 {max(w.p99 for w in with_):.1f} ms ="
        f" {max(w.p99 for w in with_) / p99:.2f}x ({p99:.1f})"
    )
    cpus = sorted(w.cpu_ms for w in without[1:] or without if w.cpu_ms is not None)
    if cpus and all(w.cpu_ms is not None for w in with_):
        cpu = cpus[len(cpus) // 2]
        most = max(w.cpu_ms or 0.0 for w in with_)
        print(
            f"server CPU per workflow: median without {cpu:.2f} ms; with retention at most"
            f" {most:.2f} ms = {most / cpu:.2f}x"
        )
    caught = next((k for k, w in enumerate(with_) if w.behind is not None and w.behind <= 2), None)
    if caught is not None and caught < len(with_) - 1:
        after = with_[caught + 1 :]  # windows wholly after retention caught up
        rates = sorted(w.rate for w in after)
        line = f"caught up: median {rates[len(rates) // 2] / median:.2f}x the rate without"
        spent = sorted(w.cpu_ms for w in after if w.cpu_ms is not None)
        if cpus and spent:
            line += f", CPU per workflow {spent[len(spent) // 2] / cpus[len(cpus) // 2]:.2f}x"
        print(f"{line} ({counted(len(after), 'window')})")
    _mixed_verdict(without, with_)
    first, last = with_[0].behind, with_[-1].behind
    if first is not None and last is not None:
        print(f"retention behind: {first:.0f} s in the first window, {last:.0f} s in the last")
    return 0


def sample(db: Path) -> tuple[float, float, float]:
    wal = db.with_name(db.name + "-wal")
    mb = 1024 * 1024
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        count = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    used = (count - free) * page / mb
    return db.stat().st_size / mb, (wal.stat().st_size / mb if wal.exists() else 0.0), used


def sample_postgres(url: str, vacuum: bool) -> tuple[float, float, float]:
    """PostgreSQL: the tables with their indexes and TOAST (MB), the WAL is not the
    store's to report (0), and the live rows' share estimated from the statistics."""
    mb = 1024 * 1024
    with psycopg.connect(url, autocommit=True) as conn:
        if vacuum:
            # What autovacuum does on a server that runs it (this machine's cluster
            # has autovacuum off): dead rows' space becomes reusable.
            conn.execute("VACUUM promises, tasks, outbox")
        found = conn.execute(
            "SELECT sum(pg_total_relation_size(c.oid)),"
            " sum(pg_total_relation_size(c.oid) * CASE WHEN s.n_live_tup + s.n_dead_tup > 0"
            " THEN s.n_live_tup::float / (s.n_live_tup + s.n_dead_tup) ELSE 1 END)"
            " FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid"
            " WHERE c.relname IN ('promises', 'tasks', 'outbox')"
        ).fetchone()
    total, live = (float(found[0] or 0), float(found[1] or 0)) if found else (0.0, 0.0)
    return total / mb, 0.0, live / mb


async def measure(
    name: str,
    work: Path,
    extra: list[str],
    seconds: float,
    clients: int,
    every: float,
    postgres: str | None = None,
    vacuum: bool = False,
) -> Run:
    db = work / f"{name}.db"
    url = pg.create_database(postgres, "troth_bench_retention") if postgres else None
    server = ServerProcess.troth(work / name, db, synchronous="full", extra=extra, postgres_url=url)
    try:
        await server.start()
        return await _load(server, name, db, url, seconds, clients, every, vacuum)
    finally:
        server.kill()
        if postgres and url:
            pg.drop_database(postgres, url)


async def _load(
    server: ServerProcess,
    name: str,
    db: Path,
    url: str | None,
    seconds: float,
    clients: int,
    every: float,
    vacuum: bool,
) -> Run:
    run = Run(name)
    try:
        started = time.monotonic()
        stop = started + seconds
        load = [
            asyncio.create_task(client(server.port, f"{name}{k}", stop, run))
            for k in range(clients)
        ]
        while time.monotonic() < stop:
            await asyncio.sleep(every)
            size = sample_postgres(url, vacuum) if url else sample(db)
            run.samples.append((time.monotonic() - started, *size))
        await asyncio.gather(*load)
        run.seconds = time.monotonic() - started
    finally:
        server.kill()
    return run


async def main_async(args: argparse.Namespace) -> int:
    horizon = args.horizon
    parse_duration(horizon)  # a clear error before anything starts
    if args.backlog:
        return await backlog(args)
    with tempfile.TemporaryDirectory(prefix="troth-retention-") as tmp:
        work = Path(tmp)
        common = ["--retention-interval", "1"]
        runs: list[Run] = []
        for k in range(args.rounds):  # alternate, so drift of the machine hits both
            order = [("retention", ["--retention", horizon, *common]), ("control", [])]
            for name, extra in order if k % 2 == 0 else order[::-1]:
                runs.append(
                    await measure(
                        name,
                        work / f"r{k}",
                        extra,
                        args.seconds,
                        args.clients,
                        args.every,
                        args.postgres,
                        args.vacuum,
                    )
                )
    load = counted(args.clients, "client")
    print(f"steady load: {load}, workflows of 4 promises (8 requests)")
    if args.postgres:
        print(f"retention {horizon} vs none; PostgreSQL; MB = tables+indexes / - / live share")
    else:
        print(f"retention {horizon} vs none; SQLite FULL; MB = database file / WAL / pages in use")
    with_ = [r for r in runs if r.name == "retention"]
    without = [r for r in runs if r.name == "control"]
    print(f"{'t s':>5}  {'with retention':>24}  {'control (none)':>24}")
    for a, b in zip(with_[0].samples, without[0].samples, strict=False):
        left = f"{a[1]:7.1f} /{a[2]:6.1f} /{a[3]:7.1f}"
        right = f"{b[1]:7.1f} /{b[2]:6.1f} /{b[3]:7.1f}"
        print(f"{a[0]:5.0f}  {left:>24}  {right:>24}")
    for r in runs:
        rate = f"{r.rate:,.0f} workflows/s ({r.rate * 8:,.0f} req/s)"
        print(f"{r.name:10} {r.workflows:,} workflows in {r.seconds:.0f} s, {rate}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m troth_bench.retention")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--horizon", default="10s")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of each")
    parser.add_argument(
        "--backlog",
        type=float,
        default=0.0,
        help="seconds of load without retention, then a restart with --retention on the"
        " same file and --seconds more: what catching up costs (windows of --window s)",
    )
    parser.add_argument("--window", type=float, default=10.0, help="--backlog: window seconds")
    parser.add_argument(
        "--mixed",
        action="store_true",
        help="--backlog: lifecycle and reads beside the workflows (troth_bench.mixed)",
    )
    parser.add_argument("--lifecycle-clients", type=int, default=24, help="--mixed (24)")
    parser.add_argument("--workers", type=int, default=8, help="--mixed: SSE workers (8)")
    parser.add_argument("--reads-clients", type=int, default=16, help="--mixed (16)")
    parser.add_argument(
        "--vacuum",
        action="store_true",
        help="with --postgres: VACUUM the tables at each sample (where autovacuum is off)",
    )
    parser.add_argument(
        "--postgres",
        help="measure PostgreSQL instead: an admin URL throwaway databases are made from"
        " (e.g. postgresql://postgres@127.0.0.1:5432/postgres); MB = tables / - / live share",
    )
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
