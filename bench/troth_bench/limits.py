"""The ceilings, measured in the same run: raw SQLite and a bare HTTP round trip.

Absolute figures swing with the machine (a shared VM's fsync latency, a neighbour's
load).  Ratios to ceilings measured minutes apart on the same file system and the
same server stack do not, so the tables print troth's figures both ways:

* raw SQLite through Python's ``sqlite3`` (what troth's writer uses), WAL, the same
  ``synchronous``: one row per durable commit (what a server without group commit
  could do) and 100 rows per commit (what batching buys at best);
* the bare round trip: :mod:`troth_bench.bare` under the same uvicorn settings,
  driven by the same generator, so it is also the generator's own ceiling.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

from troth_bench.client import Client
from troth_bench.measure import Probe, Recorder, Samples, Window
from troth_bench.procs import ServerProcess
from troth_bench.results import Limits, Series

#: About the size of a stored promise row (JSON param, value and tags).
ROW = '{"param":{"data":"eyJmdW5jIjoiYmVuY2giLCJhcmdzIjpbMV0sImt3YXJncyI6e30sInZlcnNpb24iOjF9"},"tags":{"resonate:scope":"global","resonate:origin":"bench-0000000"},"value":{}}'  # noqa: E501

#: A request of the size troth's requests have, for the bare endpoint.
ENVELOPE = (
    b'{"kind":"promise.get","head":{"corrId":"bare-1","version":"2026-04-01"},'
    b'"data":{"id":"bench-00000000"}}'
)


def sqlite_limits(directory: Path, synchronous: str, seconds: float, limits: Limits) -> None:
    """Single-row durable commits/s and 100-row batched rows/s, in ``directory``."""
    path = directory / "limit-probe.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL").fetchone()
        conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        conn.execute(
            "CREATE TABLE t (id TEXT PRIMARY KEY, state TEXT NOT NULL, body TEXT NOT NULL)"
        )
        latency = Samples()
        n = 0
        end = time.perf_counter() + seconds
        while True:
            started = time.perf_counter()
            if started >= end:
                break
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES (?, 'pending', ?)", (f"single-{n}", ROW))
            conn.execute("COMMIT")
            latency.add(time.perf_counter() - started)
            n += 1
        limits.sqlite_commits = n / seconds
        limits.sqlite_commit_latency = latency.percentiles()
        rows = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO t VALUES (?, 'pending', ?)",
                ((f"batch-{rows + k}", ROW) for k in range(100)),
            )
            conn.execute("COMMIT")
            rows += 100
        limits.sqlite_rows = rows / (time.perf_counter() - t0)
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


async def http_limit(workdir: Path, clients: int, seconds: float, limits: Limits) -> None:
    """The bare round trip at the same concurrency, with the same generator."""
    server = ServerProcess.bare(workdir)
    await server.start()
    conns: list[Client] = []
    try:
        for i in range(clients):
            conns.append(await Client.open("127.0.0.1", server.port, f"bare{i}"))
        window = Window(min(1.0, seconds / 3), seconds)
        window.start()
        rec = Recorder(window)
        probe = Probe(window, server.pid)
        probe.start()

        async def loop(c: Client) -> None:
            while window.running:
                status, _ = await c.conn.post(ENVELOPE)
                if status != 200:
                    raise RuntimeError(f"bare endpoint answered {status}")
                rec.add("requests", c.conn.read_at - c.conn.sent_at, c.conn.read_at)

        await asyncio.gather(*(loop(c) for c in conns))
        await probe.finish()
        limits.http = Series.of("bare HTTP", "req", rec.series["requests"], seconds)
        limits.http_cpu = probe.cpu
    finally:
        for c in conns:
            c.close()
        server.stop()
