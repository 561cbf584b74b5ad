"""The windows of a horizon run (:mod:`troth_bench.horizon`): a load runs without
pause while another session holds the database's xmin horizon back in the middle, and
every window prints the load's rate, p99 and max, the hot tables' dead tuples and
sizes, and the CPU of PostgreSQL, of the application and of everything else.  The
load is troth's (``horizon.Lifecycle``) or a peer's (``horizon_peer.Queue``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg

from troth_bench import pg
from troth_bench.measure import TICKS, proc_cpu


@dataclass
class Sample:
    """One window: the load's figures and the database's."""

    phase: str
    count: int
    rate: float
    p99: float
    max: float
    dead: dict[str, int]
    mb: dict[str, float]
    cpu_pg: float
    cpu_app: float
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


class Driven(Protocol):
    """A load the windows measure: troth's lifecycle, or a peer's queue."""

    #: What the first line says, e.g. ``lifecycle on troth, 32 clients``.
    title: str
    #: What one unit of the rate is (``tasks``, ``jobs``).
    unit: str
    #: The tables whose dead tuples and sizes each window shows.
    hot: tuple[str, ...]
    #: The process whose CPU is the application's (troth's server, the consumer).
    app_pid: int
    #: The counts of the window under way.
    load: Load

    def start(self, stop: float) -> None:
        """Start the load; it runs until ``time.monotonic()`` reaches ``stop``."""

    async def finish(self) -> None:
        """Stop the load and close what it opened."""


def machine_busy() -> float:
    """CPU seconds every core of the machine has been busy (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / TICKS


def cpu_of(pids: list[int]) -> float:
    return sum(c for c in (proc_cpu(p) for p in pids) if c is not None)


def table_stats(url: str, hot: tuple[str, ...]) -> tuple[dict[str, int], dict[str, float]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, n_dead_tup, pg_total_relation_size(relid) FROM"
            " pg_stat_user_tables WHERE relname = ANY(%s)",
            (list(hot),),
        ).fetchall()
    by = {r[0]: r for r in sorted(rows, key=lambda r: hot.index(r[0]))}  # in ``hot``'s order
    return {t: int(r[1]) for t, r in by.items()}, {t: int(r[2]) / 1e6 for t, r in by.items()}


class Sampler:
    """What PostgreSQL's backends of the database are busy with, and what they wait
    on (a lock, a read, the WAL; or on CPU), sampled every 20 ms from
    ``pg_stat_activity`` (a poor man's profiler: ``--sample``), per phase."""

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
                    "SELECT application_name, query, coalesce(wait_event_type || ':' ||"
                    " wait_event, 'on CPU') FROM pg_stat_activity WHERE datname ="
                    " current_database() AND state = 'active' AND pid <> pg_backend_pid()"
                ).fetchall()
                counts = self.counts.setdefault(self.phase, Counter())
                waits = self.counts.setdefault(f"{self.phase}, waiting on", Counter())
                counts["(samples)"] += 1
                waits["(samples)"] += 1
                for app, query, wait in rows:
                    counts[f"{app}: {' '.join(str(query).split())[:90]}"] += 1
                    waits[wait] += 1

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
            self.conn.execute("SELECT 1").fetchone()  # the snapshot is taken here
        else:
            self.conn.execute("CREATE TABLE IF NOT EXISTS horizon_holder (x int)")
            self.conn.execute("INSERT INTO horizon_holder VALUES (1)")

    def release(self) -> None:
        if self.conn is not None:
            self.conn.rollback()
            self.conn.close()
            self.conn = None


async def windows(
    args: argparse.Namespace,
    url: str,
    driven: Driven,
    explain: Callable[[str, str], None] | None = None,
) -> list[Sample]:
    """Run ``driven`` for ``before + hold + after`` seconds on the database at ``url``,
    holding its horizon back in the middle, and print one line per window;
    ``explain(url, when)`` early and late in the hold when given (``--explain``)."""
    total = args.before + args.hold + args.after
    hot = driven.hot
    holder = Holder(url, args.holder)
    pg_pids = pg.backend_pids(args.postgres_admin, [pg.dbname_of(url)])
    samples: list[Sample] = []
    print(
        f"{driven.title}; {args.before:.0f} s, then {args.hold:.0f} s with the horizon held"
        f" ({args.holder}), then {args.after:.0f} s"
    )
    print(
        f"{'#':>3} {'phase':8} {driven.unit + '/s':>8} {'p99 ms':>7} {'max ms':>7}"
        + "".join(f" {'dead ' + t:>14}" for t in hot)
        + "".join(f" {t + ' MB':>11}" for t in hot)
        + f" {'pg cpu':>7} {'app':>6} {'others':>6}",
        flush=True,
    )
    began = time.monotonic()
    driven.start(began + total)
    mark = began
    cpu_mark = (cpu_of(pg_pids), cpu_of([driven.app_pid]), machine_busy(), time.process_time())
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
            count, lat = driven.load.close()
            ordered = sorted(lat) or [0.0]
            dead, mb = await asyncio.to_thread(table_stats, url, hot)
            cpu_now = (
                cpu_of(pg_pids),
                cpu_of([driven.app_pid]),
                machine_busy(),
                time.process_time(),
            )
            span = now - mark
            d_pg, d_app, d_all, d_self = (b - a for a, b in zip(cpu_mark, cpu_now, strict=True))
            samples.append(
                Sample(
                    phase,
                    count,
                    count / span,
                    ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
                    ordered[-1] * 1000,
                    dead,
                    mb,
                    d_pg / span,
                    d_app / span,
                    max(0.0, d_all - d_pg - d_app - d_self) / span,
                )
            )
            s = samples[-1]
            print(
                f"{len(samples):3} {s.phase:8} {s.rate:8,.0f} {s.p99:7.1f} {s.max:7.1f}"
                + "".join(f" {s.dead.get(t, 0):14,}" for t in hot)
                + "".join(f" {s.mb.get(t, 0.0):11.1f}" for t in hot)
                + f" {s.cpu_pg:7.2f} {s.cpu_app:6.2f} {s.cpu_others:6.2f}",
                flush=True,
            )
            mark, cpu_mark = now, cpu_now
            if sampler is not None:
                sampler.phase = phase
            held_for = t - args.before
            if explain is not None and phase == "held":
                if "early" not in explained:
                    explained.add("early")
                    await asyncio.to_thread(explain, url, f"held {held_for:.0f} s")
                elif t + args.window > args.before + args.hold + 0.5:
                    await asyncio.to_thread(explain, url, f"held {held_for:.0f} s")
            if phase == "before" and args.hold > 0 and t + args.window > args.before + 0.5:
                holder.hold()
            if phase == "held" and t + args.window > args.before + args.hold + 0.5:
                holder.release()
    finally:
        if sampler is not None:
            sampler.stopped.set()
            sampler.thread.join()
            sampler.report()
        holder.release()
        await driven.finish()
    return samples


def summary(samples: list[Sample], unit: str, hold: float) -> str | None:
    """The worst window of the hold against the median before it (the first window
    before is left out: it warms up), printed and returned after the space the hot
    tables took (:func:`space`); None when too short.  Without a hold (``hold`` 0) the
    run is a baseline: the same load, whose space a run with a hold is held against."""
    before = [s for s in samples if s.phase == "before"][1:] or [
        s for s in samples if s.phase == "before"
    ]
    held = [s for s in samples if s.phase == "held"]
    if samples:
        space(samples, unit)
    if before and not hold:
        verdict = f"no hold: {statistics.median(s.rate for s in before):,.0f} {unit}/s"
        print(verdict, flush=True)
        return verdict
    if not before or not held:
        print("too short: no window before or during the hold")
        return None
    rate = statistics.median(s.rate for s in before)
    p99 = statistics.median(s.p99 for s in before)
    worst = min(held, key=lambda s: s.rate)
    verdict = (
        f"{worst.rate:,.0f} {unit}/s = {worst.rate / rate:.2f}x the median before"
        f" ({rate:,.0f}); p99 up to {max(s.p99 for s in held):.1f} ms ="
        f" {max(s.p99 for s in held) / p99:.2f}x ({p99:.1f}); max"
        f" {max(s.max for s in held):.0f} ms; CPU ms per {unit[:-1]}: PostgreSQL"
        f" {_per(before, 'cpu_pg')} -> {_per(held, 'cpu_pg', max)}, the application"
        f" {_per(before, 'cpu_app')} -> {_per(held, 'cpu_app', max)}"
    )
    print(f"worst window of the hold: {verdict}", flush=True)
    return verdict


def space(samples: list[Sample], unit: str) -> None:
    """What the hot tables take at the end of the run, in all and per unit of the load
    done.  Held against a run of the same paced load without a hold (``--hold 0``),
    it says whether the dead rows a hold left behind were taken back and reused, or
    are still paid for."""
    done = sum(s.count for s in samples)
    mb = samples[-1].mb
    total = sum(mb.values())
    each = ", ".join(f"{t} {v:,.1f}" for t, v in mb.items())
    per = f"{total * 1e6 / done:,.0f} bytes per {unit[:-1]}" if done else "nothing done"
    print(f"space at the end: {total:,.1f} MB ({each}) after {done:,} {unit}: {per}", flush=True)


def _per(
    samples: list[Sample], cpu: str, pick: Callable[[list[float]], float] = statistics.median
) -> str:
    """CPU milliseconds per unit of the load (``cpu`` is ``cpu_pg`` or ``cpu_app``) over
    ``samples``: their median, or what ``pick`` takes (the hold's worst: ``max``).  What
    the load costs the machine, which a paced load (``--rate``) shows where its rate
    cannot."""
    per = [getattr(s, cpu) * 1000 / s.rate for s in samples if s.rate > 0]
    return f"{pick(per):.2f}" if per else "-"
