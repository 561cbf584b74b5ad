"""``python -m troth_bench.ui`` (docs/benchmarks.md), the dashboard's bench, runs tiny:
on memory and on a throwaway PostgreSQL database."""

from __future__ import annotations

import pytest


def test_the_dashboard_bench_runs_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m troth_bench.ui`` (docs/benchmarks.md) on 300 promises: every view's
    requests answer 200 (it asserts so) and the table is printed."""
    from troth_bench.ui import main

    assert main(["300", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "/ops/tree?id=wf&limit=1000" in out and "per view" in out


def test_the_dashboard_bench_runs_tiny_on_postgres(capsys: pytest.CaptureFixture[str]) -> None:
    """``--postgres``: seeded into a fresh database on that server, dropped after."""
    import psycopg

    from helpers.pg import ADMIN_URL
    from troth_bench.ui import main

    def databases() -> set[str]:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            rows = conn.execute("SELECT datname FROM pg_database").fetchall()
        return {r[0] for r in rows if r[0].startswith("troth_bench_ui")}

    before = databases()
    assert main(["300", "--repeat", "1", "--postgres", ADMIN_URL]) == 0
    out = capsys.readouterr().out
    assert "(postgres)" in out and "/ops/timeline?id=wf&limit=200" in out
    assert databases() == before
