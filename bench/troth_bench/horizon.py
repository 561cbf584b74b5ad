"""What a held xmin horizon costs troth on PostgreSQL (docs/operations.md, "Backups,
long queries and the horizon").

``python -m troth_bench.horizon [--before 60] [--hold 180] [--after 30] [--window 20]
[--clients 32] [--workers 8] [--rate N] [--holder snapshot|xid] [--explain] [--sample]
[--auto-explain MS] [--autovacuum] [--peer pgqueuer [--producers 32]]``

starts one ``troth serve`` on a throwaway PostgreSQL database and runs the
``lifecycle`` load on it (a targeted ``promise.create``, its ``execute`` over SSE,
``task.acquire``, ``task.fulfill``) without pause: ``--before`` seconds as is, then
``--hold`` seconds while another session holds the database's xmin horizon back, then
``--after`` seconds once it let go.  ``--rate N`` paces troth's clients to N tasks per
second in all (each starts its next task on a fixed schedule, at once when behind):
a sustained load below what the machine can do, so that a window that keeps the rate
says the hold cost nothing a user sees, and one that falls short says it did, however
the machine's own speed drifts over a long run (a closed loop's rate follows that
drift).  The holder is what an operator meets:
``snapshot`` is a REPEATABLE READ transaction that took its snapshot (``pg_dump``, a
long report), ``xid`` a session idle in transaction after a write (it holds an xid).

Every ``--window`` seconds it prints tasks per second, request p99 and max, the dead
tuples and total sizes of the hot tables, and the CPU of PostgreSQL, of troth and of
everything else on the machine (a busy machine is a noisy measurement).  At the end:
the worst window of the hold against the median before it.  ``--explain`` prints
``EXPLAIN (ANALYZE, BUFFERS)`` of the statements the server runs most, early and late
in the hold: which of them walk dead tuples.  ``--autovacuum`` turns the cluster's
autovacuum on for the run when it is off (a production server runs it; a lab's may
not), so that the tables are kept small before the hold and cleaned up after it.
``--peer pgqueuer`` then runs PgQueuer's
queue the same way on a database of its own (:mod:`troth_bench.horizon_peer`) and
prints the two verdicts side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from troth_bench import pg
from troth_bench.client import BenchFailure, Client
from troth_bench.horizon_peer import pgqueuer
from troth_bench.horizon_windows import Load, summary, windows
from troth_bench.measure import Recorder, Window
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


@contextmanager
def autovacuum(admin: str, wanted: bool) -> Iterator[None]:
    """With ``wanted``, the cluster's autovacuum on for the ``with`` block when it is
    off (``ALTER SYSTEM``, reset after): a production server runs it, and what a held
    horizon does is keep it from removing dead rows.  Says which way the run goes."""
    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
        on = row is not None and row[0] == "on"
        turned = wanted and not on
        if turned:
            conn.execute("ALTER SYSTEM SET autovacuum = on")
            conn.execute("SELECT pg_reload_conf()")
    print(
        "-- autovacuum: "
        + ("on for this run (reset after)" if turned else "on" if on else "off (--autovacuum)")
    )
    try:
        yield
    finally:
        if turned:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM RESET autovacuum")
                conn.execute("SELECT pg_reload_conf()")


async def run(args: argparse.Namespace) -> int:
    with autovacuum(args.postgres_admin, args.autovacuum):
        return await measure(args)


async def measure(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="troth-horizon-") as tmp:
        with pg.throwaway(args.postgres_admin, "troth_horizon") as url:
            if args.auto_explain is not None:
                auto_explain(args.postgres_admin, pg.dbname_of(url), args.auto_explain)
            server = ServerProcess.troth(
                Path(tmp), Path(tmp) / "unused.db", synchronous="full", postgres_url=url
            )
            await server.start()
            try:
                troth = await Lifecycle.open(args, server)
                samples = await windows(args, url, troth, explain if args.explain else None)
            finally:
                server.kill()
        verdicts = [summary(samples, "tasks", args.hold)]
        if args.peer == "pgqueuer":
            print()
            try:
                verdicts.append(await pgqueuer(args, Path(tmp)))
            except BenchFailure as exc:
                print(f"PgQueuer: {exc}")
                return 2
    if len(verdicts) > 1:
        print("-- side by side: the worst window of the hold against the median before")
        for name, verdict in zip(("troth", args.peer), verdicts, strict=True):
            print(f"   {name:9} {verdict or 'too short'}")
    return 0 if all(verdicts) else 1


class Lifecycle:
    """troth's ``lifecycle`` without pause: a targeted ``promise.create``, its
    ``execute`` over SSE, ``task.acquire``, ``task.fulfill``."""

    unit = "tasks"
    hot: tuple[str, ...] = HOT

    def __init__(
        self,
        args: argparse.Namespace,
        server: ServerProcess,
        run_id: str,
        ctx: Ctx,
        pool: WorkerPool,
        clients: list[Client],
        spare: Client,
    ) -> None:
        self.title = (
            f"lifecycle on troth (PostgreSQL), {args.clients} clients, {args.workers} SSE workers"
            + (f", paced to {args.rate:,.0f} tasks/s" if args.rate else "")
        )
        #: Seconds between one client's task starts (``--rate``), or 0: without pause.
        self.every = args.clients / args.rate if args.rate else 0.0
        self.app_pid = server.pid
        self.load = Load()
        self.run_id = run_id
        self.ctx, self.pool, self.clients, self.spare = ctx, pool, clients, spare
        self.ledger = Ledger()
        self.tasks: list[asyncio.Task[None]] = []
        forever = Window(0, 10**6)  # a window that never closes: the load splits them
        forever.start()
        self.rec = Recorder(forever)

    @classmethod
    async def open(cls, args: argparse.Namespace, server: ServerProcess) -> Lifecycle:
        opts = Options(clients=args.clients, workers=args.workers)
        run_id = f"hz{int(time.time())}"
        port = server.port
        clients = [
            await Client.open("127.0.0.1", port, f"{run_id}-c{i}") for i in range(args.clients)
        ]
        spare = await Client.open("127.0.0.1", port, f"{run_id}-spare")
        ctx = Ctx("127.0.0.1", port, opts, run_id, clients, spare, server.pid)
        pool = WorkerPool(ctx, f"{run_id}-lc", args.workers)
        await pool.open()
        return cls(args, server, run_id, ctx, pool, clients, spare)

    def start(self, stop: float) -> None:
        self.tasks = [
            asyncio.create_task(self._client(i, c, stop)) for i, c in enumerate(self.clients)
        ]

    async def _client(self, i: int, c: Client, stop: float) -> None:
        ctx, pool, rec, load = self.ctx, self.pool, self.rec, self.load
        n = 0
        # Paced: a client's n-th task is due n * every after its first; the clients'
        # first tasks are spread over one ``every``.
        first = time.monotonic() + self.every * i / len(self.clients)
        while time.monotonic() < stop:
            if self.every:
                await asyncio.sleep(first + n * self.every - time.monotonic())
            id = f"{self.run_id}-{i}-{n}"
            n += 1
            fut = pool.expect(id, 0)
            began = time.perf_counter()
            await create_targeted(c, rec, id, n, ctx.tag("horizon"), pool.target)
            load.latencies.append(time.perf_counter() - began)
            _, pid = await pool.wait(fut, id)
            began = time.perf_counter()
            acq = {"id": id, "version": 0, "pid": pid, "ttl": 60_000}
            body, _ = await c.ok("task.acquire", acq)
            version = self.ledger.acquired(body, id)
            load.latencies.append(time.perf_counter() - began)
            began = time.perf_counter()
            await fulfil_timed(c, rec, self.ledger, id, version)
            load.latencies.append(time.perf_counter() - began)
            load.tasks += 1

    async def finish(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.pool.close()
        for c in [*self.clients, self.spare]:
            c.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m troth_bench.horizon", description=__doc__)
    p.add_argument("--before", type=float, default=60.0, help="seconds before the hold (60)")
    p.add_argument("--hold", type=float, default=180.0, help="seconds the horizon is held (180)")
    p.add_argument("--after", type=float, default=30.0, help="seconds after it (30)")
    p.add_argument("--window", type=float, default=20.0, help="seconds per window (20)")
    p.add_argument("--clients", type=int, default=32, help="lifecycle clients (32)")
    p.add_argument("--workers", type=int, default=8, help="SSE workers (8)")
    p.add_argument(
        "--rate",
        type=float,
        metavar="N",
        help="pace the clients to N tasks/s in all (default: each without pause)",
    )
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
        "--autovacuum",
        action="store_true",
        help="turn the cluster's autovacuum on for the run if it is off (reset after)",
    )
    p.add_argument(
        "--peer",
        choices=("pgqueuer",),
        help="then the same with PgQueuer's queue on a database of its own"
        " (troth-bench's pgqueuer extra)",
    )
    p.add_argument("--producers", type=int, default=32, help="PgQueuer producers with --peer (32)")
    p.add_argument(
        "--postgres-admin",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="maintenance database the throwaway database is created from",
    )
    args = p.parse_args(argv)
    if 0 < args.hold < args.window:
        # No window would be judged held: say so now, not after minutes of load.
        print(
            f"troth-bench horizon: a hold of {args.hold:g} s is shorter than a window"
            f" ({args.window:g} s, --window): nothing would be measured while held",
            file=sys.stderr,
        )
        return 2
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
