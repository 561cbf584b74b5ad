"""``troth bench`` through PgBouncer in transaction mode: the nodes it starts get
``--postgres-pool-mode`` and ``--postgres-listen-url``, and a tiny run verifies.

A check that the comparison docs/benchmarks.md shows ("Through PgBouncer": direct,
pooler in session mode, pooler in transaction mode) can be run — not a measurement.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

from helpers.pg import ADMIN_URL, throwaway_database
from helpers.pgbouncer import needs_pgbouncer, pgbouncer
from troth_bench import runner
from troth_bench.options import Options

pytestmark = needs_pgbouncer


def test_two_nodes_through_a_transaction_pooler(tmp_path: Path) -> None:
    import uvloop

    with throwaway_database("troth_bench_pooled") as url, pgbouncer("transaction") as bouncer:
        opts = Options(
            clients=4,
            warmup=0.2,
            duration=0.6,
            store="postgres",
            postgres_admin=ADMIN_URL,
            postgres_url=bouncer.url(url),
            postgres_pool_mode="transaction",
            postgres_listen_url=url,
            limit_seconds=1,
            dir=str(tmp_path),
            nodes=(2,),
            workloads=("create-settle",),
            scale=(),
        )
        out = io.StringIO()
        bench = runner.Bench(opts, out)
        assert bench.pool_flags() == [
            *["--postgres-pool-mode", "transaction", "--postgres-listen-url", url]
        ]
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as loop:
            loop.run(bench.main_run(2))
    (result,) = bench.report.results
    assert result.checks, out.getvalue()
    assert result.nodes == 2


def test_by_default_the_nodes_are_told_session() -> None:
    flags = runner.Bench(Options(), io.StringIO()).pool_flags()
    assert flags == ["--postgres-pool-mode", "session"]
