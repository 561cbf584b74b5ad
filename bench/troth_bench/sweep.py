"""The open-loop latency curve: offered load against p50/p99/p999, per workload.

After a workload's closed-loop run (its maximum at ``--clients`` concurrency), the
same operation is offered open-loop (:mod:`troth_bench.openloop`) at fixed arrival
rates — by default 25, 50, 75, 90 and 100 % of that maximum — and each rate's
latencies, achieved rate and late operations are printed.  The knee of the curve,
where p99 leaves the floor, is the load an operator sizes a node by: the closed
loop's maximum is what the server does flat out, not what it does with a latency
anyone wants.

One operation is the closed loop's unit: for ``create-settle`` a promise created
then settled (two requests, on one connection), for ``lifecycle`` one task
(targeted create → ``execute`` over SSE → ``task.acquire`` → ``task.fulfill``),
timed from its intended start to the fulfil's answer.  Every operation is verified
as in the closed loop (each promise read back resolved, each task acquired and
fulfilled once).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from troth.plural import counted
from troth_bench.client import FAR, BenchFailure, Client, expect_state, promise_of
from troth_bench.measure import Window
from troth_bench.openloop import OpenLoop, Operation, Run
from troth_bench.options import Offered
from troth_bench.results import Result
from troth_bench.svg import Line, Panel, chart
from troth_bench.workloads import TAG, Ctx, Ledger, WorkerPool, expect_census, param

#: Workloads with an open-loop form, and what one of their operations is.
OPERATIONS = {
    "create-settle": ("promise", "promise.create + promise.settle (2 requests)"),
    "lifecycle": ("task", "create → execute over SSE → acquire → fulfill"),
}
#: The closed-loop line whose rate is the workload's maximum, in operations/s.
CLOSED_LINE = {"create-settle": "promise.settle", "lifecycle": "tasks"}
QUANTILES = ("p50", "p99", "p999")


@dataclass
class Point:
    label: str  # "50%" of the closed-loop maximum, or "rate" for an explicit one
    run: Run

    def to_json(self) -> dict[str, Any]:
        r = self.run
        return {
            "label": self.label,
            "offered": r.offered,
            "achieved": r.achieved,
            "latency_ms": r.latency_ms(),
            "send_lag_p99_ms": r.lag_p99_ms(),
            "measured": len(r.latencies),
            "late": r.late,
            "connections": r.connections,
            "jobs_per_commit": r.jobs_per_commit,
            "cpu": {
                "server": r.cpu.server,
                "generator": r.cpu.generator,
                "elsewhere": r.cpu.elsewhere,
            },
        }


@dataclass
class Curve:
    """One workload's sweep."""

    workload: str
    unit: str  # what one operation is called ("promise", "task")
    closed_max: float | None  # operations/s of the closed loop, when it ran
    clients: int  # the closed loop's concurrency
    cap: int
    arrivals: str
    points: list[Point] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    context: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "unit": self.unit,
            "closed_max": self.closed_max,
            "clients": self.clients,
            "cap": self.cap,
            "arrivals": self.arrivals,
            "context": self.context,
            "points": [p.to_json() for p in self.points],
            "checks": self.checks,
        }


def rates(loads: Sequence[Offered], closed_max: float | None) -> list[tuple[str, float]]:
    """``(label, operations/s)`` of each load; a percentage needs the closed maximum."""
    out = []
    for load in loads:
        if load.percent:
            if not closed_max:
                raise BenchFailure("the open loop's percentages need the closed-loop maximum")
            out.append((f"{load.value:g}%", closed_max * load.value / 100))
        else:
            out.append(("rate", load.value))
    return out


async def open_loop(
    ctx: Ctx,
    name: str,
    closed: Result | None,
    before: Callable[[str], Awaitable[None]] | None = None,
) -> Curve:
    """The sweep of workload ``name`` on ``ctx``'s server, after its closed run;
    ``before`` is awaited ahead of each rate (``--wait-quiet``)."""
    opts = ctx.opts
    line = closed.line(CLOSED_LINE[name]) if closed is not None else None
    closed_max = line.rate if line is not None else None
    curve = Curve(
        name, OPERATIONS[name][0], closed_max, opts.clients, opts.open_loop_cap, opts.arrivals
    )

    async def connect(k: int) -> Client:
        return await Client.open(*ctx.node(k), f"{ctx.run}-ol{k}")

    loop = OpenLoop(connect, opts.open_loop_cap, ctx.clients)
    pool = WorkerPool(ctx, f"{ctx.run}-ollc", opts.workers) if name == "lifecycle" else None
    ledger = Ledger()
    try:
        if pool is not None:
            await pool.open()
        for step, (label, rate) in enumerate(rates(opts.open_loop, closed_max)):
            tag_name = f"{name}-open{step}"
            op = _operation(ctx, name, step, ctx.tag(tag_name), pool, ledger)
            if before is not None:
                await before(f"{name} open loop at {label}")
            run = await loop.run(
                rate,
                Window(opts.warmup, opts.duration),
                op,
                pid=ctx.pid,
                snapshot=ctx.metrics if ctx.metrics_url else None,
                arrivals=opts.arrivals,
                seed=step + 1,
                drain=2 * opts.op_timeout,
            )
            curve.points.append(Point(label, run))
            curve.checks.append(
                await expect_census(ctx, tag_name, "resolved", run.scheduled) + f" at {rate:,.0f}/s"
            )
    finally:
        loop.close()
        if pool is not None:
            await pool.close()
    if pool is not None:
        curve.checks += pool.check()
        curve.checks.append(f"{len(ledger.fulfilled):,} tasks acquired once and fulfilled once")
    return curve


def _operation(
    ctx: Ctx, name: str, step: int, tag: str, pool: WorkerPool | None, ledger: Ledger
) -> Operation:
    prefix = f"{ctx.run}-ol-{name}{step}"

    async def create_settle(c: Client, n: int) -> tuple[float, float]:
        id = f"{prefix}-{n}"
        data = {
            "id": id,
            "timeoutAt": FAR,
            "param": param(n),
            "tags": {TAG: tag, "resonate:scope": "global", "resonate:origin": id},
        }
        body, _ = await c.ok("promise.create", data)
        started = c.conn.sent_at
        expect_state(promise_of(body, "promise.create"), "pending", "created promise")
        settle = {"id": id, "state": "resolved", "value": {"data": "dHJ1ZQ=="}}
        body, _ = await c.ok("promise.settle", settle)
        expect_state(promise_of(body, "promise.settle"), "resolved", "settled promise")
        return started, c.conn.read_at

    async def lifecycle(c: Client, n: int) -> tuple[float, float]:
        assert pool is not None
        id = f"{prefix}-{n}"
        fut = pool.expect(id, 0)
        data = {
            "id": id,
            "timeoutAt": FAR,
            "param": param(n),
            "tags": {TAG: tag, "resonate:target": pool.target},
        }
        body, _ = await c.ok("promise.create", data)
        started = c.conn.sent_at
        expect_state(promise_of(body, "promise.create"), "pending", "created promise")
        _, pid = await pool.wait(fut, id)
        acq = {"id": id, "version": 0, "pid": pid, "ttl": 60_000}
        version = ledger.acquired((await c.ok("task.acquire", acq))[0], id)
        ful = {
            "id": id,
            "version": version,
            "action": {
                "kind": "promise.settle",
                "head": {},
                "data": {"id": id, "state": "resolved", "value": {}},
            },
        }
        ledger.fulfil((await c.ok("task.fulfill", ful))[0], id)
        return started, c.conn.read_at

    return create_settle if name == "create-settle" else lifecycle


# -- output -----------------------------------------------------------------------------------


def curve_lines(curve: Curve) -> list[str]:
    from troth_bench.report import ms, table

    title = f"open loop: {curve.workload}" + (f" ({curve.context})" if curve.context else "")
    lines = [f"-- {title} " + "-" * max(0, 60 - len(title))]
    what = OPERATIONS[curve.workload][1]
    if curve.closed_max:
        lines.append(
            f"  closed-loop maximum {curve.closed_max:,.0f} {curve.unit}/s at"
            f" {counted(curve.clients, 'client')}; 1 {curve.unit} = {what}"
        )
    rows = []
    for p in curve.points:
        r = p.run
        q = r.latency_ms()
        rows.append(
            [
                p.label,
                f"{r.offered:,.0f}",
                f"{r.achieved:,.0f}",
                *(ms(q.get(k)) for k in (*QUANTILES, "max")),
                ms(r.lag_p99_ms()),
                f"{r.late:,}",
                str(r.connections),
                "-" if r.jobs_per_commit is None else f"{r.jobs_per_commit:.1f}",
                "-" if r.cpu.server is None else f"{r.cpu.server:.2f}",
                f"{r.cpu.generator:.2f}",
                "-" if r.cpu.elsewhere is None else f"{r.cpu.elsewhere:.2f}",
            ]
        )
    head = ["load", f"offered {curve.unit}/s", "achieved", "p50 ms", "p99 ms", "p999 ms"]
    head += ["max ms", "lag p99", "late", "conns", "req/txn", "srv CPU", "gen CPU", "other"]
    lines += table(head, rows)
    lines.append(
        f"  note: {curve.arrivals} arrivals; latency from each {curve.unit}'s intended start"
        f" to its last answer; lag = first write − intended start"
        " (the wait for a free connection, or the generator's own delay);"
        f" late = started while all {counted(curve.cap, 'connection')} were busy;"
        " req/txn = requests per group-commit transaction"
    )
    if any(p.run.cpu.generator >= 0.9 for p in curve.points):
        lines.append("  WARNING: the generator was saturated (>= 0.9 cores) at some rate")
    for check in curve.checks:
        lines.append(f"  verified: {check}")
    return lines


def chart_of(curves: Sequence[Curve], caption: str = "") -> str:
    """The SVG: one panel per curve, offered load on x, one line per percentile."""
    panels = []
    for c in curves:
        lines = [
            Line(q, [(p.run.offered, p.run.latency_ms().get(q, 0.0)) for p in c.points])
            for q in QUANTILES
        ]
        marker = None
        if c.closed_max:
            marker = (c.closed_max, f"closed-loop max {c.closed_max:,.0f}/s")
        title = c.workload + (f" ({c.context})" if c.context else "")
        top = max(c.points, key=lambda p: p.run.offered, default=None)
        notes = [] if top is None else [f"achieved at the top rate: {top.run.achieved:,.0f}/s"]
        panels.append(Panel(title, f"offered load, {c.unit}s/s", lines, marker, notes))
    return chart(panels, caption)


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
