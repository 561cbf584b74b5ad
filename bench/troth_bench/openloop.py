"""Open-loop load: operations started on a clock, not when the previous one answered.

A closed loop (the rest of the bench) slows down with the server: when the server
stalls, its clients stop sending, so the stall shows in one request's latency and
not in the hundreds that real users would have sent meanwhile (coordinated
omission).  Here a dispatcher releases operation *k* at its intended time
``t0 + k / rate`` (or Poisson arrivals), whatever happened to the others, and each
operation's latency runs from its intended time to its last answer: requests
scheduled while the server stalled carry the stall.

Connections are the concurrency: one operation per connection at a time (as an SDK's
pooled connection), the pool grows on demand up to ``cap``.  An operation whose time
has come while all ``cap`` connections are busy is **late**: it waits in order for
the next free connection, still timed from its intended time, and the run counts
it; the schedule never slows down.  A late operation means the figures are the
cap's as much as the server's, and the table says so.

libuv's timers have a 1 ms resolution (and can fire up to half a millisecond
early), so the dispatcher releases, at each wake-up, every operation due within
the next millisecond.  An operation released early is timed from its actual first
write instead, so no latency is ever shorter than the round trip it measures.

``python -m troth_bench.openloop --rates 5000,20000`` measures the generator alone:
the open loop against the bare HTTP endpoint (``troth_bench.bare``), to show the
rates one generator process can offer on this machine and its CPU per request.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from troth_bench.client import BenchFailure, Client
from troth_bench.measure import CpuShare, Probe, Snapshot, Window, wait_quiet

#: How early the dispatcher may release an operation (libuv's timer resolution).
TICK = 0.001
ARRIVALS = ("uniform", "poisson")

#: One operation: given its connection and sequence number, run it and return
#: ``(first write, last answer read)`` in ``time.perf_counter()`` seconds.
Operation = Callable[[Client, int], Awaitable[tuple[float, float]]]
#: Opens the k-th connection of the pool.
Connect = Callable[[int], Awaitable[Client]]


def quantile(ordered: list[float], q: float) -> float:
    """Nearest-rank quantile of sorted ``ordered`` (as ``Samples.percentiles``)."""
    n = len(ordered)
    return ordered[min(n - 1, max(0, int(q * n + 0.999999) - 1))]


@dataclass
class Run:
    """One rate's figures.  Latencies (seconds) are those of every operation
    *intended* inside the window, waited for to the end; ``done`` counts operations
    (whenever intended) that *finished* inside it, for the achieved rate."""

    offered: float  # operations/s scheduled
    seconds: float  # the window
    latencies: list[float] = field(default_factory=list)
    send_lag: list[float] = field(default_factory=list)  # first write − intended time
    done: int = 0
    scheduled: int = 0  # operations released over the whole run (warm-up included)
    late: int = 0  # intended in the window, released while all the cap's connections were busy
    connections: int = 0  # pool size at the end (grows on demand up to the cap)
    cpu: CpuShare = field(default_factory=CpuShare)
    #: Requests per group-commit transaction over the window (troth's /metrics).
    jobs_per_commit: float | None = None

    @property
    def achieved(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    def latency_ms(self) -> dict[str, float]:
        """p50/p99/p999/max in milliseconds; empty when nothing was measured."""
        if not self.latencies:
            return {}
        ordered = sorted(self.latencies)
        out = {k: quantile(ordered, q) * 1000 for k, q in (("p50", 0.5), ("p99", 0.99))}
        out["p999"] = quantile(ordered, 0.999) * 1000
        out["max"] = ordered[-1] * 1000
        return out

    def lag_p99_ms(self) -> float:
        return quantile(sorted(self.send_lag), 0.99) * 1000 if self.send_lag else 0.0


class OpenLoop:
    """The connection pool of one workload, reused from rate to rate."""

    def __init__(self, connect: Connect, cap: int, initial: list[Client] | None = None) -> None:
        if cap < 1:
            raise ValueError("the open loop needs a cap >= 1")
        self.connect = connect
        self.cap = cap
        self.pool: list[Client] = list(initial or [])[:cap]
        self.opened: list[Client] = []  # the ones this loop opened (closed by close())

    def close(self) -> None:
        for c in self.opened:
            c.close()

    async def run(
        self,
        rate: float,
        window: Window,
        op: Operation,
        *,
        pid: int | list[int] | None = None,
        snapshot: Snapshot | None = None,
        arrivals: str = "uniform",
        seed: int = 1,
        drain: float = 30.0,
    ) -> Run:
        """Offer ``rate`` operations/s from now through ``window`` (started here), then
        wait up to ``drain`` seconds for the ones still in flight.  ``pid`` (the
        server's) is probed for CPU over the window and ``snapshot`` (its counters)
        read at the window's edges, as the closed loop does."""
        if rate <= 0:
            raise ValueError("the open loop needs a rate > 0")
        window.start()
        t0 = window.begin - window.warmup
        result = Run(rate, window.duration)
        queue: asyncio.Queue[tuple[int, float] | None] = asyncio.Queue()
        state = {"idle": 0, "backlog": 0}
        failures: list[BaseException] = []
        workers: list[asyncio.Task[None]] = []

        def record(intended: float, started: float, finished: float) -> None:
            if window.inside(finished):
                result.done += 1
            if window.begin <= intended < window.end:
                result.latencies.append(finished - min(intended, started))
                result.send_lag.append(max(0.0, started - intended))

        async def worker(client: Client | None, k: int) -> None:
            try:
                if client is None:
                    client = await self.connect(k)
                    self.opened.append(client)
                    self.pool.append(client)
                while True:
                    item = await queue.get()
                    if item is None:
                        return
                    n, intended = item
                    started, finished = await op(client, n)
                    record(intended, started, finished)
                    if state["backlog"]:
                        state["backlog"] -= 1
                    else:
                        state["idle"] += 1
            except Exception as exc:  # ends the run (the dispatcher stops releasing)
                failures.append(exc)

        for k, c in enumerate(self.pool):
            state["idle"] += 1
            workers.append(asyncio.create_task(worker(c, k)))

        def release(n: int, intended: float) -> None:
            if state["idle"]:
                state["idle"] -= 1  # a waiting worker takes it
            elif len(workers) < self.cap:
                workers.append(asyncio.create_task(worker(None, len(workers))))
            else:
                if window.begin <= intended < window.end:
                    result.late += 1  # counted like the latencies: in the window
                state["backlog"] += 1
            queue.put_nowait((n, intended))

        probe = Probe(window, pid, snapshot=snapshot)
        probe.start()
        rng = random.Random(seed)
        n = 0
        due = t0
        try:
            while due < window.end and not failures:
                horizon = time.perf_counter() + TICK
                while due <= horizon and due < window.end:
                    release(n, due)
                    n += 1
                    due = t0 + n / rate if arrivals == "uniform" else due + rng.expovariate(rate)
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
            result.scheduled = n
            for _ in workers:
                queue.put_nowait(None)
            _, pending = await asyncio.wait(workers, timeout=drain)
            if pending:
                for t in pending:
                    t.cancel()
                raise BenchFailure(
                    f"open loop at {rate:,.0f}/s: {len(pending)} operations still in flight"
                    f" {drain:.0f} s after the window"
                )
            await probe.finish()
        except BaseException:
            probe.cancel()
            for t in workers:
                t.cancel()
            raise
        if failures:
            raise failures[0]
        result.cpu = probe.cpu
        result.connections = len(self.pool)
        before, after = probe.snapshots
        batches = after.get("troth_commit_batches_total", 0) - before.get(
            "troth_commit_batches_total", 0
        )
        if batches > 0:
            jobs = after.get("troth_commit_jobs_total", 0) - before.get(
                "troth_commit_jobs_total", 0
            )
            result.jobs_per_commit = jobs / batches
        return result


# -- the generator alone, against the bare endpoint ----------------------------------------


async def bare_runs(rates: list[float], seconds: float, cap: int, quiet: float = 0.0) -> list[Run]:
    """Open-loop runs of empty POSTs at ``rates`` against a fresh bare server; with
    ``quiet`` > 0, each waits up to that many seconds for an idle machine first."""
    import tempfile
    from pathlib import Path

    from troth_bench.http import HttpConnection
    from troth_bench.limits import ENVELOPE
    from troth_bench.procs import ServerProcess

    with tempfile.TemporaryDirectory(prefix="troth-openloop-") as tmp:
        server = ServerProcess.bare(Path(tmp))
        await server.start()

        async def connect(k: int) -> Client:
            return await Client.open("127.0.0.1", server.port, f"ol{k}")

        async def op(c: Client, n: int) -> tuple[float, float]:
            if c.conn.lost is not None:  # closed while idle (uvicorn: after 5 s)
                c.conn = await HttpConnection.open(c.conn.host, c.conn.port)
            status, _ = await c.conn.post(ENVELOPE)
            if status != 200:
                raise BenchFailure(f"bare endpoint answered {status}")
            return c.conn.sent_at, c.conn.read_at

        # Opened before the first window, as the sweep reuses the closed loop's 64.
        loop = OpenLoop(connect, cap, [await connect(k) for k in range(min(64, cap))])
        loop.opened += loop.pool
        try:
            out = []
            for rate in rates:
                if quiet > 0:
                    await wait_quiet(quiet)
                out.append(await loop.run(rate, Window(1.0, seconds), op, pid=server.pid))
            return out
        finally:
            loop.close()
            server.stop()


def bare_lines(runs: list[Run]) -> list[str]:
    from troth_bench.report import table

    rows = []
    for r in runs:
        q = r.latency_ms()
        cost = r.cpu.generator / r.achieved * 1e6 if r.achieved else 0.0
        rows.append(
            [
                f"{r.offered:,.0f}",
                "",
                f"{r.achieved:,.0f}",
                *(f"{q.get(k, 0):.2f}" for k in ("p50", "p99", "p999")),
                f"{r.lag_p99_ms():.2f}",
                f"{r.late:,}",
                str(r.connections),
                f"{r.cpu.generator:.2f}",
                f"{cost:.1f}",
                f"{r.cpu.server or 0:.2f}",
                "-" if r.cpu.elsewhere is None else f"{r.cpu.elsewhere:.2f}",
            ]
        )
    head = ["offered/s", "", "achieved/s", "p50 ms", "p99 ms", "p999 ms", "lag p99"]
    head += ["late", "conns", "gen CPU", "gen µs/req", "bare CPU", "other"]
    return [
        "open loop against the bare HTTP endpoint (the generator's own ceiling)",
        *table(head, rows),
    ]


def main(argv: list[str] | None = None) -> int:
    import uvloop

    p = argparse.ArgumentParser(prog="python -m troth_bench.openloop", description=__doc__)
    p.add_argument("--rates", default="5000,10000,20000", help="requests/s, comma-separated")
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per rate")
    p.add_argument("--cap", type=int, default=512, help="most connections (512)")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        help="before each rate, wait up to this many seconds for an idle machine",
    )
    args = p.parse_args(argv)
    rates = [float(x) for x in args.rates.split(",") if x.strip()]
    runs = uvloop.run(bare_runs(rates, args.seconds, args.cap, args.wait_quiet))
    print("\n".join(bare_lines(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
