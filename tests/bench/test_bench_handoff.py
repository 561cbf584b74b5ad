"""``troth bench --workloads handoff``: a worker group under a concurrency limit, from a
freed slot to the next ``execute``.

Tiny runs (no ceilings measured) on each store: one result per limit and one for
lifecycle beside a limit, each verified, the limit held by the workers' own count,
and the limit gone afterwards.  A server that ignores the limit fails the run.  Not a
measurement: CI does not judge speed.
"""

from __future__ import annotations

import asyncio
import io
from dataclasses import replace
from pathlib import Path

import pytest

from helpers.pg import ADMIN_URL
from troth_bench import runner, workloads
from troth_bench.client import BenchFailure
from troth_bench.options import Options
from troth_bench.report import target_lines

TINY = Options(
    clients=4,
    warmup=0.2,
    duration=0.8,
    workers=2,
    workloads=("handoff",),
    handoff_limits=(1, 3),
    handoff_backlog=6,
    op_timeout=20,
)

pytestmark = pytest.mark.timeout(120)


def run(opts: Options, nodes: int = 1) -> tuple[runner.Bench, str]:
    """The workloads on a server the bench starts, without the ceilings."""
    import uvloop

    out = io.StringIO()
    bench = runner.Bench(opts, out)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as loop:
            loop.run(bench.main_run(nodes))
    finally:
        bench.cleanup()
    return bench, out.getvalue()


@pytest.mark.parametrize("store", ["sqlite", "memory", "postgres"])
def test_handoff_measures_each_limit_and_the_limit_holds(store: str, tmp_path: Path) -> None:
    opts = replace(TINY, dir=str(tmp_path), store=store, postgres_admin=ADMIN_URL)
    bench, text = run(opts)
    results = bench.report.results
    where = ", 1 node" if store == "postgres" else ""
    assert [(r.name, r.context) for r in results] == [
        ("handoff", f"limit 1{where}"),
        ("handoff", f"limit 3{where}"),
        ("lifecycle-beside-limit", where.removeprefix(", ")),
    ], text
    for r, limit in zip(results, (1, 3), strict=False):
        assert [s.name for s in r.series] == ["handoff", "after answer", "tasks", "requests"]
        handoff, tasks = r.line("handoff"), r.line("tasks")
        assert handoff is not None and handoff.count > 0 and handoff.rate is None
        assert {"p50", "p90", "p99", "max"} <= handoff.latency.keys()
        assert handoff.latency["p50"] >= 0  # never before the fulfil was written
        assert tasks is not None and tasks.rate is not None and tasks.rate > 0
        # The workers' own count: never more executes or acquisitions than the limit.
        held = next(c for c in r.checks if c.startswith("at most"))
        assert f"(limit {limit})" in held
        most = int(held.split()[2])
        assert 1 <= most <= limit, held
        assert any("fulfilled once" in c for c in r.checks)
        assert f"-- handoff (limit {limit}{where})" in text
        assert f"the server's count afterwards: limit {limit}, 0 in use, 0 held" in r.checks
    beside = results[-1]
    assert beside.line("tasks") is not None and beside.line("dispatch") is not None


def test_the_targets_table_reads_each_limit(tmp_path: Path) -> None:
    bench, _ = run(replace(TINY, dir=str(tmp_path), store="memory", handoff_limits=(2,)))
    lines = target_lines(bench.report.results, [], 2, "full", TINY.clients)
    text = "\n".join(lines)
    assert "handoff (limit 2): fulfil written → next execute p50 <= 5 ms" in text
    assert "lifecycle beside a limit ÷ lifecycle" in text


def test_a_server_that_ignores_the_limit_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the limit on the server, every held task's execute goes out at once:
    the workers count more than the limit and the run fails, giving no figures."""

    async def not_set(ctx: workloads.Ctx, group: str, concurrency: int | None) -> None:
        return None

    monkeypatch.setattr(workloads, "set_limit", not_set)
    opts = replace(TINY, dir=str(tmp_path), store="memory", handoff_limits=(1,))
    with pytest.raises(BenchFailure, match="beyond the limit of 1"):
        run(opts)
