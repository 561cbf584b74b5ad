"""What a held xmin horizon costs troth on PostgreSQL (docs/operations.md, "Backups,
long queries and the horizon").

``python -m troth_bench.horizon [--before 60] [--hold 180] [--after 30] [--window 20]
[--clients 32] [--workers 8] [--holder snapshot|xid] [--explain] [--sample]
[--auto-explain MS]``

starts one ``troth serve`` on a throwaway PostgreSQL database and runs the
``lifecycle`` load on it (a targeted ``promise.create``, its ``execute`` over SSE,
``task.acquire``, ``task.fulfill``) without pause: ``--before`` seconds as is, then
``--hold`` seconds while another session holds the database's xmin horizon back, then
``--after`` seconds once it let go.  The holder is what an operator meets:
``snapshot`` is a REPEATABLE READ transaction that took its snapshot (``pg_dump``, a
long report), ``xid`` a session idle in transaction after a write (it holds an xid).

Every ``--window`` seconds it prints tasks per second, request p99 and max, the dead
tuples and total sizes of the hot tables, and the CPU of PostgreSQL, of troth and of
everything else on the machine (a busy machine is a noisy measurement).  At the end:
the worst window of the hold against the median before it.  ``--explain`` prints
``EXPLAIN (ANALYZE, BUFFERS)`` of the statements the server runs most, early and late
in the hold: which of them walk dead tuples.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from troth_bench import pg
from troth_bench.client import Client
from troth_bench.measure import TICKS, Recorder, Window, proc_cpu
from troth_bench.options import Options
from troth_bench.procs import ServerProcess
from troth_bench.workloads import Ctx, Ledger, WorkerPool, create_targeted, fulfil_timed

#: The tables a claim, a timer pass and a settlement walk.
HOT = ("outbox", "tasks", "promises")

#: What the server runs most, as read-only statements EXPLAIN can run: the claim's
#: scan, the timer's due lists and next deadline, the reaper's and purge's scans.
PROBES: dict[str, str] = {
    "claim": "SELECT id FROM outbox WHERE state = 'pending' AND available_at <= {now}"
    " ORDER BY available_at, id LIMIT 64 FOR UPDATE SKIP LOCKED",
    "due tasks": "SELECT id FROM tasks WHERE (state = 'pending' AND retry_at <= {now}) OR"
    " (state = 'acquired' AND expires_at <= {now}) ORDER BY CASE WHEN state = 'pending'"
    " THEN retry_at ELSE expires_at END, id LIMIT 64 FOR UPDATE SKIP LOCKED",
    "next retry": "SELECT min(retry_at) FROM tasks WHERE state = 'pending'",
    "next expiry": "SELECT min(expires_at) FROM tasks WHERE state = 'acquired'",
    "next timeout": "SELECT min(timeout_at) FROM promises WHERE state = 'pending' AND external",
    "next message": "SELECT min(available_at) FROM outbox WHERE state = 'pending'",
    "reaper": "SELECT count(*) FROM outbox WHERE state = 'dispatching' AND"
    " coalesce(claimed_at, 0) < {now} - 60000",
    "purge": "SELECT count(*) FROM outbox WHERE state = 'completed' AND updated_at < {now} - 60000",
}


@dataclass
class Sample:
    """One window: the load's figures and the database's."""

    phase: str
    tasks: float
    p99: float
    max: float
    dead: dict[str, int]
    mb: dict[str, float]
    cpu_pg: float
    cpu_troth: float
    cpu_others: float


@dataclass
class Load:
    """The counts of the window under way (the clients add to them)."""

    tasks: int = 0
    latencies: list[float] = field(default_factory=list)

    def close(self) -> tuple[int, list[float]]:
        out = (self.tasks, self.latencies)
        self.tasks, self.latencies = 0, []
        return out


def machine_busy() -> float:
    """CPU seconds every core of the machine has been busy (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / TICKS


def cpu_of(pids: list[int]) -> float:
    return sum(c for c in (proc_cpu(p) for p in pids) if c is not None)


def table_stats(url: str) -> tuple[dict[str, int], dict[str, float]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, n_dead_tup, pg_total_relation_size(relid) FROM"
            " pg_stat_user_tables WHERE relname = ANY(%s)",
            (list(HOT),),
        ).fetchall()
    return {r[0]: int(r[1]) for r in rows}, {r[0]: int(r[2]) / 1e6 for r in rows}


def explain(url: str, when: str) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of :data:`PROBES`, in a transaction rolled back."""
    now = time.time_ns() // 1_000_000
    print(f"-- {when}: EXPLAIN (ANALYZE, BUFFERS)", flush=True)
    with psycopg.connect(url) as conn:
        for name, sql in PROBES.items():
            rows = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.format(now=now)
            ).fetchone()
            conn.rollback()
            assert rows is not None
            plan = rows[0][0]
            top = plan["Plan"]
            hit = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
            print(
                f"   {name:13} {plan['Execution Time']:9.2f} ms {hit:8,} buffers  {_nodes(top)}",
                flush=True,
            )


def _nodes(plan: dict[str, Any]) -> str:
    """The plan's scan nodes, e.g. ``Index Scan outbox_state_available``."""
    out: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        if "Scan" in node["Node Type"]:
            out.append(f"{node['Node Type']} {node.get('Index Name', node.get('Relation Name'))}")
        for child in node.get("Plans", []):
            walk(child)

    walk(plan)
    return "; ".join(out)


class Sampler:
    """What PostgreSQL's backends of the database are busy with, sampled every 20 ms
    from ``pg_stat_activity`` (a poor man's profiler: ``--sample``), per phase."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.phase = "before"
        self.counts: dict[str, Counter[str]] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stopped.wait(0.02):
                rows = conn.execute(
                    "SELECT application_name, query FROM pg_stat_activity WHERE datname ="
                    " current_database() AND state = 'active' AND pid <> pg_backend_pid()"
                ).fetchall()
                counts = self.counts.setdefault(self.phase, Counter())
                counts["(samples)"] += 1
                for app, query in rows:
                    counts[f"{app}: {' '.join(str(query).split())[:90]}"] += 1

    def report(self) -> None:
        for phase, counts in self.counts.items():
            samples = counts.pop("(samples)", 0) or 1
            print(f"-- busy backends while {phase} ({samples:,} samples): share of samples")
            for what, n in counts.most_common(12):
                print(f"   {n / samples:6.1%}  {what}")


class Holder:
    """A session holding the horizon back: a snapshot, or an xid idle in transaction."""

    def __init__(self, url: str, kind: str) -> None:
        self.url = url
        self.kind = kind
        self.conn: psycopg.Connection[Any] | None = None

    def hold(self) -> None:
        self.conn = psycopg.connect(self.url)
        if self.kind == "snapshot":
            self.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            self.conn.execute("SELECT count(*) FROM promises").fetchone()
        else:
            self.conn.execute("CREATE TABLE IF NOT EXISTS horizon_holder (x int)")
            self.conn.execute("INSERT INTO horizon_holder VALUES (1)")

    def release(self) -> None:
        if self.conn is not None:
            self.conn.rollback()
            self.conn.close()
            self.conn = None


def auto_explain(admin: str, db: str, ms: int) -> None:
    """Every statement of the database's new sessions slower than ``ms`` is logged with
    its plan, buffers and timings (``auto_explain``) in PostgreSQL's server log."""
    with psycopg.connect(admin, autocommit=True) as conn:
        for setting, value in (
            ("session_preload_libraries", "auto_explain"),
            ("auto_explain.log_min_duration", str(ms)),
            ("auto_explain.log_analyze", "on"),
            ("auto_explain.log_buffers", "on"),
        ):
            conn.execute(f"ALTER DATABASE {db} SET {setting} = '{value}'")
    print(f"-- auto_explain: statements of {db} slower than {ms} ms go to the server log")


async def run(args: argparse.Namespace) -> int:
    with (
        tempfile.TemporaryDirectory(prefix="troth-horizon-") as tmp,
        pg.throwaway(args.postgres_admin, "troth_horizon") as url,
    ):
        if args.auto_explain is not None:
            auto_explain(args.postgres_admin, pg.dbname_of(url), args.auto_explain)
        server = ServerProcess.troth(
            Path(tmp), Path(tmp) / "unused.db", synchronous="full", postgres_url=url
        )
        await server.start()
        try:
            return await drive(args, server, url)
        finally:
            server.kill()


async def drive(args: argparse.Namespace, server: ServerProcess, url: str) -> int:
    opts = Options(clients=args.clients, workers=args.workers)
    run_id = f"hz{int(time.time())}"
    clients = [
        await Client.open("127.0.0.1", server.port, f"{run_id}-c{i}") for i in range(args.clients)
    ]
    spare = await Client.open("127.0.0.1", server.port, f"{run_id}-spare")
    ctx = Ctx("127.0.0.1", server.port, opts, run_id, clients, spare, server.pid)
    pool = WorkerPool(ctx, f"{run_id}-lc", args.workers)
    await pool.open()
    ledger, load = Ledger(), Load()
    total = args.before + args.hold + args.after
    # A window that never closes: the Recorder keeps every latency, the load splits them.
    forever = Window(0, 10 * total)
    forever.start()
    rec = Recorder(forever)
    stop = time.monotonic() + total

    async def client(i: int, c: Client) -> None:
        n = 0
        while time.monotonic() < stop:
            id = f"{run_id}-{i}-{n}"
            n += 1
            fut = pool.expect(id, 0)
            began = time.perf_counter()
            await create_targeted(c, rec, id, n, ctx.tag("horizon"), pool.target)
            load.latencies.append(time.perf_counter() - began)
            _, pid = await pool.wait(fut, id)
            began = time.perf_counter()
            acq = {"id": id, "version": 0, "pid": pid, "ttl": 60_000}
            body, _ = await c.ok("task.acquire", acq)
            version = ledger.acquired(body, id)
            load.latencies.append(time.perf_counter() - began)
            began = time.perf_counter()
            await fulfil_timed(c, rec, ledger, id, version)
            load.latencies.append(time.perf_counter() - began)
            load.tasks += 1

    holder = Holder(url, args.holder)
    pg_pids = pg.backend_pids(args.postgres_admin, [pg.dbname_of(url)])
    samples: list[Sample] = []
    print(
        f"lifecycle on PostgreSQL, {args.clients} clients, {args.workers} SSE workers;"
        f" {args.before:.0f} s, then {args.hold:.0f} s with the horizon held"
        f" ({args.holder}), then {args.after:.0f} s"
    )
    print(
        f"{'#':>3} {'phase':8} {'tasks/s':>8} {'p99 ms':>7} {'max ms':>7}"
        + "".join(f" {'dead ' + t:>14}" for t in HOT)
        + "".join(f" {t + ' MB':>11}" for t in HOT)
        + f" {'pg cpu':>7} {'troth':>6} {'others':>6}",
        flush=True,
    )
    tasks = [asyncio.create_task(client(i, c)) for i, c in enumerate(clients)]
    began = time.monotonic()
    mark = began
    cpu_mark = (cpu_of(pg_pids), cpu_of([server.pid]), machine_busy(), time.process_time())
    explained: set[str] = set()
    sampler = Sampler(url) if args.sample else None
    if sampler is not None:
        sampler.thread.start()
    try:
        while mark + args.window <= began + total + 0.5:
            await asyncio.sleep(max(0.0, mark + args.window - time.monotonic()))
            now = time.monotonic()
            t = now - began
            phase = (
                "before"
                if t <= args.before + 0.5
                else ("held" if t <= args.before + args.hold + 0.5 else "after")
            )
            count, lat = load.close()
            ordered = sorted(lat) or [0.0]
            dead, mb = await asyncio.to_thread(table_stats, url)
            cpu_now = (cpu_of(pg_pids), cpu_of([server.pid]), machine_busy(), time.process_time())
            span = now - mark
            d_pg, d_troth, d_all, d_self = (b - a for a, b in zip(cpu_mark, cpu_now, strict=True))
            samples.append(
                Sample(
                    phase,
                    count / span,
                    ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
                    ordered[-1] * 1000,
                    dead,
                    mb,
                    d_pg / span,
                    d_troth / span,
                    max(0.0, d_all - d_pg - d_troth - d_self) / span,
                )
            )
            s = samples[-1]
            print(
                f"{len(samples):3} {s.phase:8} {s.tasks:8,.0f} {s.p99:7.1f} {s.max:7.1f}"
                + "".join(f" {s.dead.get(t, 0):14,}" for t in HOT)
                + "".join(f" {s.mb.get(t, 0.0):11.1f}" for t in HOT)
                + f" {s.cpu_pg:7.2f} {s.cpu_troth:6.2f} {s.cpu_others:6.2f}",
                flush=True,
            )
            mark, cpu_mark = now, cpu_now
            if sampler is not None:
                sampler.phase = phase
            held_for = t - args.before
            if args.explain and phase == "held" and "early" not in explained:
                explained.add("early")
                await asyncio.to_thread(explain, url, f"held {held_for:.0f} s")
            elif (
                args.explain and phase == "held" and t + args.window > args.before + args.hold + 0.5
            ):
                await asyncio.to_thread(explain, url, f"held {held_for:.0f} s")
            if phase == "before" and t + args.window > args.before + 0.5:
                holder.hold()
            if phase == "held" and t + args.window > args.before + args.hold + 0.5:
                holder.release()
    finally:
        if sampler is not None:
            sampler.stopped.set()
            sampler.thread.join()
            sampler.report()
        holder.release()
        stop = 0.0
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await pool.close()
        for c in [*clients, spare]:
            c.close()
    return summary(samples)


def summary(samples: list[Sample]) -> int:
    before = [s for s in samples if s.phase == "before"][1:] or [
        s for s in samples if s.phase == "before"
    ]
    held = [s for s in samples if s.phase == "held"]
    if not before or not held:
        print("too short: no window before or during the hold")
        return 1
    rate = statistics.median(s.tasks for s in before)
    p99 = statistics.median(s.p99 for s in before)
    worst = min(held, key=lambda s: s.tasks)
    print(
        f"worst window of the hold: {worst.tasks:,.0f} tasks/s = {worst.tasks / rate:.2f}x the"
        f" median before ({rate:,.0f}); p99 up to {max(s.p99 for s in held):.1f} ms ="
        f" {max(s.p99 for s in held) / p99:.2f}x ({p99:.1f}); max"
        f" {max(s.max for s in held):.0f} ms"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m troth_bench.horizon", description=__doc__)
    p.add_argument("--before", type=float, default=60.0, help="seconds before the hold (60)")
    p.add_argument("--hold", type=float, default=180.0, help="seconds the horizon is held (180)")
    p.add_argument("--after", type=float, default=30.0, help="seconds after it (30)")
    p.add_argument("--window", type=float, default=20.0, help="seconds per window (20)")
    p.add_argument("--clients", type=int, default=32, help="lifecycle clients (32)")
    p.add_argument("--workers", type=int, default=8, help="SSE workers (8)")
    p.add_argument("--holder", choices=("snapshot", "xid"), default="snapshot")
    p.add_argument("--explain", action="store_true", help="EXPLAIN the hot statements")
    p.add_argument(
        "--auto-explain",
        type=int,
        metavar="MS",
        help="log the plans of statements slower than MS in PostgreSQL's server log",
    )
    p.add_argument(
        "--sample", action="store_true", help="sample what PostgreSQL's backends are busy with"
    )
    p.add_argument(
        "--postgres-admin",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="maintenance database the throwaway database is created from",
    )
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
