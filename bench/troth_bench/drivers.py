"""psycopg 3 against asyncpg, on the shape of work troth's PostgreSQL writer does.

troth talks to PostgreSQL through psycopg 3 from its writer thread.  asyncpg is the
driver people reach for when they want speed, so this measures both on one
connection (troth has one writer per node) doing what a group-commit batch does:
a point read that locks (``SELECT … FOR UPDATE``), an upsert, and COMMIT.  Each
driver runs the same statements for the same time, with ``synchronous_commit`` on
(what troth runs with: the flush dominates) and off (what is left is the driver and
the round trips).  It prints transactions/s and the client CPU per transaction.

    python -m troth_bench.drivers [--url URL] [--seconds 3]

Without ``--url`` it creates a throwaway database on the local cluster and drops it
afterwards.  asyncpg comes with the lab's ``pgqueuer`` extra
(``pip install -e './bench[pgqueuer]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from troth_bench.pg import as_uri, throwaway

_SETUP = (
    "CREATE TABLE IF NOT EXISTS drivers_bench"
    " (id TEXT PRIMARY KEY, state TEXT NOT NULL, n BIGINT NOT NULL)"
)
_READ = "SELECT id, state, n FROM drivers_bench WHERE id = $1 FOR UPDATE"
_WRITE = (
    "INSERT INTO drivers_bench (id, state, n) VALUES ($1, 'pending', $2)"
    " ON CONFLICT (id) DO UPDATE SET n = excluded.n, state = 'resolved'"
)
#: Distinct ids cycled through: enough that rows are both created and updated.
IDS = 1000


@dataclass(frozen=True)
class DriverFigure:
    driver: str
    synchronous_commit: str
    transactions: int
    seconds: float
    cpu_seconds: float

    @property
    def per_second(self) -> float:
        return self.transactions / self.seconds

    @property
    def cpu_us(self) -> float:
        return self.cpu_seconds / max(self.transactions, 1) * 1e6


def _timed(driver: str, sync: str, seconds: float, step: Callable[[int], None]) -> DriverFigure:
    n = 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        step(n)
        n += 1
    return DriverFigure(driver, sync, n, time.perf_counter() - t0, time.process_time() - cpu0)


def run_psycopg(url: str, sync: str, seconds: float) -> DriverFigure:
    """Synchronous psycopg 3, as troth's writer thread uses it (server-side prepared
    statements after the default threshold)."""
    read = _READ.replace("$1", "%s")
    write = _WRITE.replace("$1", "%s").replace("$2", "%s")
    with psycopg.connect(url, autocommit=False) as conn:
        conn.execute(f"SET synchronous_commit = {sync}")
        conn.commit()
        cur = conn.cursor()

        def step(i: int) -> None:
            key = f"k{i % IDS}"
            cur.execute(read, (key,)).fetchone()
            cur.execute(write, (key, i))
            conn.commit()

        return _timed("psycopg", sync, seconds, step)


async def _asyncpg(url: str, sync: str, seconds: float) -> DriverFigure:
    # The bench extra, imported by name: the server and the tests do not need it.
    asyncpg: Any = importlib.import_module("asyncpg")
    conn = await asyncpg.connect(as_uri(url))
    try:
        await conn.execute(f"SET synchronous_commit = {sync}")
        read = await conn.prepare(_READ)
        n = 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            key = f"k{n % IDS}"
            async with conn.transaction():
                await read.fetchrow(key)
                await conn.execute(_WRITE, key, n)
            n += 1
        return DriverFigure(
            "asyncpg", sync, n, time.perf_counter() - t0, time.process_time() - cpu0
        )
    finally:
        await conn.close()


def run_asyncpg(url: str, sync: str, seconds: float) -> DriverFigure:
    return asyncio.run(_asyncpg(url, sync, seconds))


def compare(url: str, seconds: float) -> list[DriverFigure]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_SETUP)
    figures: list[DriverFigure] = []
    for sync in ("on", "off"):
        for run in (run_psycopg, run_asyncpg):
            run(url, sync, min(seconds, 0.5))  # warm-up: connections, plans, rows
            figures.append(run(url, sync, seconds))
    return figures


def report(figures: list[DriverFigure]) -> str:
    lines = [
        "driver    synchronous_commit   tx/s      client CPU/tx",
        *(
            f"{f.driver:<9} {f.synchronous_commit:<20} {f.per_second:>8,.0f}  {f.cpu_us:>8.1f} µs"
            for f in figures
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m troth_bench.drivers", description=__doc__)
    p.add_argument("--url", help="a database to use (default: a throwaway one)")
    p.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args(argv)
    if args.url:
        figures = compare(args.url, args.seconds)
    else:
        with throwaway(args.admin_url) as url:
            figures = compare(url, args.seconds)
    print(report(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
