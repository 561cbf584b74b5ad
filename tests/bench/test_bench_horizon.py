"""``python -m troth_bench.horizon``: the lab's measurement of a held horizon runs
troth (and PgQueuer beside it) in windows before, during and after the hold, and
judges the worst window of the hold against the median before."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers.pg import ADMIN_URL

SHORT = ["--before", "3", "--hold", "3", "--after", "1", "--window", "1"]


def horizon(*args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "troth_bench.horizon", *SHORT, "--postgres-admin", ADMIN_URL, *args],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def phases(out: str, unit: str) -> list[tuple[str, float]]:
    """(phase, rate) of each window of the table whose header names ``unit``."""
    table = out.split(f"{unit}/s", 1)[1]
    rows = re.findall(r"^\s*\d+ (before|held|after)\s+([\d,]+)", table, re.M)
    return [(phase, float(rate.replace(",", ""))) for phase, rate in rows]


@pytest.mark.parametrize("holder, rate", [("snapshot", None), ("xid", 60)])
def test_troth_is_measured_in_windows_before_during_and_after_the_hold(
    holder: str, rate: int | None
) -> None:
    """Unpaced, and paced (``--rate``) to far below what 4 clients do unpaced."""
    paced = ["--rate", str(rate)] if rate else []
    out = horizon("--clients", "4", "--workers", "1", "--holder", holder, *paced)
    seen = phases(out, "tasks")
    assert [p for p, _ in seen].count("held") >= 2, out
    assert {p for p, _ in seen} == {"before", "held", "after"}, out
    assert all(r > 0 for _, r in seen), out
    if rate:
        # The mean over the windows (one late window catches up on what a stall held
        # back): near the rate, where four clients without pause do several times it.
        mean = sum(r for _, r in seen) / len(seen)
        assert rate * 0.7 <= mean <= rate * 1.2, out
    verdict = re.search(r"worst window of the hold: [\d,]+ tasks/s = ([\d.]+)x.*", out)
    assert verdict is not None and float(verdict.group(1)) > 0, out
    cost = re.search(r"CPU ms per task: PostgreSQL ([\d.]+) -> ([\d.]+)", verdict.group(0))
    assert cost is not None and float(cost.group(1)) > 0, out


def test_a_run_without_a_hold_holds_nothing_and_reports_its_space() -> None:
    """``--hold 0`` is the baseline a held run's space is compared with: no window is
    held, no other session holds the horizon (the dead rows of its windows are taken
    back), and the space line counts what was done."""
    out = horizon("--clients", "2", "--workers", "1", "--rate", "40", "--hold", "0")
    seen = phases(out, "tasks")
    assert {p for p, _ in seen} == {"before", "after"}, out
    assert re.search(r"^no hold: [\d,]+ tasks/s", out, re.M), out
    space = re.search(
        r"space at the end: ([\d.,]+) MB \(outbox [\d.,]+, tasks [\d.,]+, promises [\d.,]+\)"
        r" after ([\d,]+) tasks: ([\d,]+) bytes per task",
        out,
    )
    assert space is not None, out
    mb, done, per = (float(g.replace(",", "")) for g in space.groups())
    assert done == pytest.approx(sum(r for _, r in seen), rel=0.2), out
    assert per * done / 1e6 == pytest.approx(mb, abs=0.051), out  # MB printed to 0.1


def test_pgqueuer_is_measured_beside_it() -> None:
    pytest.importorskip("pgqueuer", reason="pip install -e './bench[pgqueuer]'")
    out = horizon("--clients", "2", "--workers", "1", "--peer", "pgqueuer", "--producers", "4")
    assert [p for p, _ in phases(out, "jobs")].count("held") >= 2, out
    assert re.search(r"jobs each reported complete once; queue empty", out), out
    side = out.split("-- side by side", 1)[1]
    assert re.search(r"^\s+troth\s+[\d,]+ tasks/s = [\d.]+x", side, re.M), out
    assert re.search(r"^\s+pgqueuer\s+[\d,]+ jobs/s = [\d.]+x", side, re.M), out


def test_a_hold_shorter_than_a_window_is_refused_before_any_load() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "troth_bench.horizon",
            "--hold",
            "10",
            "--window",
            "20",
            "--postgres-admin",
            "postgresql://nobody@127.0.0.1:1/none",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "a hold of 10 s is shorter than a window (20 s, --window)" in r.stderr
    assert r.stdout == ""  # nothing started: no database, no server


def test_troth_bench_hold_horizon_needs_postgres() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "troth.cli.main", "bench", "--hold-horizon", "5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--hold-horizon needs --store postgres" in r.stderr
