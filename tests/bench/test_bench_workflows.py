"""``troth bench --workloads sdk-workflows``: the Python SDK's workflows under load on
troth (SQLite, PostgreSQL) and on the resonate-pg peer, run tiny with the real SDK,
real servers and a real PostgreSQL.

The SDK's venv is built once in the SDK cache (as the SDK tests do), with the
``resonate-pg`` connector beside it.  resonate-pg's ``resonate.sql`` is not in that
package: the peer's test runs where ``TROTH_RESONATE_SQL`` names a copy of it.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from helpers.pg import ADMIN_URL
from helpers.sdk_env import build_python_sdk
from troth_bench import runner, sdk_load
from troth_bench.options import Options

TINY = Options(
    dir=None,
    workloads=("sdk-workflows",),
    wf_steps=4,
    wf_count=6,
    wf_inflight=3,
    wf_single=2,
    postgres_admin=ADMIN_URL,
)
SQL = os.environ.get("TROTH_RESONATE_SQL")
NO_SQL = (
    "set TROTH_RESONATE_SQL to resonate.sql from github.com/resonatehq/resonate-pg"
    " (the resonate-pg package does not ship it)"
)


@pytest.fixture(scope="module")
def sdk_venv() -> Path:
    """resonate-sdk with resonate-pg, in the SDK cache where the bench finds it."""
    return build_python_sdk((sdk_load.PG_CONNECTOR,)).python


def _check(phases: list[sdk_load.Phase], target: str, procs: tuple[int, ...]) -> None:
    mine = [p for p in phases if p.target == target]
    assert [(p.kind, p.processes) for p in mine] == [
        ("single", 1),
        *(("batch", n) for n in procs),
    ]
    for p in mine:
        count = TINY.wf_single if p.kind == "single" else TINY.wf_count
        assert p.workflows == count and len(p.walls) == count
        assert len(p.gaps) == count * (TINY.wf_steps - 1)
        assert all(g > 0 for g in p.gaps) and p.rate > 0
        assert p.cores["sdk"] >= 0
        if target == sdk_load.PEER:
            assert "server" not in p.cores and p.server_ms_per_step is None
        else:
            assert "server" in p.cores
        assert ("postgres" in p.cores) == (target != "troth sqlite")


def test_sdk_workflows_on_troth_sqlite_and_postgres(tmp_path: Path, sdk_venv: Path) -> None:
    """Both stores, a single phase and batch phases over 1 and 2 SDK processes."""
    out = io.StringIO()
    opts = replace(TINY, dir=str(tmp_path), sdk_processes=(1, 2))
    report = runner.run(opts, out)
    text = out.getvalue()
    assert report.ok, text
    assert "-- sdk-workflows" in text and "server CPU ms/step" in text
    for store in ("sqlite", "postgres"):
        _check(report.sdk_workflows, f"troth {store}", (1, 2))
    assert sdk_load.find_python(True) is not None


@pytest.mark.skipif(not SQL, reason=NO_SQL)
def test_sdk_workflows_beside_resonate_pg(tmp_path: Path, sdk_venv: Path) -> None:
    """The peer on a throwaway database with resonate.sql applied, beside troth on
    SQLite, in alternating order over two rounds; the summary compares them."""
    out = io.StringIO()
    opts = replace(
        TINY,
        dir=str(tmp_path),
        wf_stores=("sqlite",),
        peers=("resonate-pg",),
        resonate_sql=SQL,
        rounds=2,
    )
    report = runner.run(opts, out)
    text = out.getvalue()
    assert report.ok, text
    order = [p.target for p in report.sdk_workflows if p.kind == "single"]
    assert order == ["troth sqlite", sdk_load.PEER, sdk_load.PEER, "troth sqlite"]
    _check(report.sdk_workflows[:2] + report.sdk_workflows[4:6], sdk_load.PEER, (1,))
    assert "a workflow alone, step p50" in text and "vs resonate-pg" in text


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "troth.cli.main", "bench", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_resonate_pg_needs_its_sql_and_the_workload(tmp_path: Path) -> None:
    """Nothing runs (exit 2) when the peer cannot be set up, and the message says
    where resonate.sql comes from."""
    got = _bench("--workloads", "sdk-workflows", "--peers", "resonate-pg")
    assert got.returncode == 2 and "--resonate-sql PATH" in got.stderr
    assert "github.com/resonatehq/resonate-pg" in got.stderr
    wrong = tmp_path / "other.sql"
    wrong.write_text("CREATE TABLE t (id int);\n")
    got = _bench(
        "--workloads", "sdk-workflows", "--peers", "resonate-pg", "--resonate-sql", str(wrong)
    )
    assert got.returncode == 2 and "does not define resonate.resonate_rpc" in got.stderr
    got = _bench("--workloads", "reads", "--peers", "resonate-pg", "--resonate-sql", str(wrong))
    assert got.returncode == 2 and "runs with --workloads sdk-workflows" in got.stderr


def test_summary_compares_each_store_with_the_peer() -> None:
    def phase(target: str, kind: str, p50: float, rate_s: float) -> sdk_load.Phase:
        return sdk_load.Phase(target, kind, 1, 4, 10, rate_s, [p50 * 3] * 10, [p50] * 30)

    lines = sdk_load.summary_lines(
        [
            phase(sdk_load.PEER, "single", 4.0, 1.0),
            phase(sdk_load.PEER, "batch", 40.0, 1.0),
            phase("troth postgres", "single", 2.0, 1.0),
            phase("troth postgres", "batch", 20.0, 0.25),
        ]
    )
    assert lines == [
        "  troth postgres: a workflow alone, step p50 2.00 ms vs resonate-pg 4.00 ms (0.50×)",
        "  troth postgres: 1 SDK process(es), 40.0 workflows/s vs resonate-pg 10.0 (4.00×)",
    ]


def test_an_answer_longer_than_asyncio_default_line_limit_is_read(tmp_path: Path) -> None:
    """A big phase's answer (every step's gap) is one line of megabytes."""
    import asyncio
    import json

    program = tmp_path / "long.py"
    program.write_text(
        "import json, sys\nsys.stdin.readline()\n"
        "print(json.dumps({'gaps': [1.5] * 300_000}), flush=True)\n"
    )
    proc = sdk_load.SdkProcess(Path(sys.executable), "", 2, "g", tmp_path / "log")
    proc.argv = [sys.executable, str(program)]

    async def scenario() -> int:
        await proc.start()
        try:
            return len((await proc.ask("batch 1 1"))["gaps"])
        finally:
            await proc.stop()

    assert len(json.dumps([1.5] * 300_000)) > 2**16
    assert asyncio.run(scenario()) == 300_000
