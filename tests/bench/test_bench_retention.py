"""``python -m troth_bench.retention --backlog S --mixed``: the operator's check of
retention catching up under a mixed load, in a tiny run.

A backlog phase without retention, then the server restarted with ``--retention``
on the same file: every window carries the workflows' figures and, beside them,
lifecycle's tasks and the reads; the verdict compares both phases for all three, and
retention, which had a backlog to delete, said how far behind it was.  Not a
measurement: CI does not judge speed.
"""

from __future__ import annotations

import re

import pytest

from troth_bench import retention

pytestmark = pytest.mark.timeout(120)


def test_a_mixed_backlog_run_reports_every_load_in_both_phases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--backlog", "4", "--seconds", "4", "--window", "2", "--horizon", "1s", "--mixed"]
    args += ["--clients", "2", "--lifecycle-clients", "2", "--workers", "2"]
    assert retention.main([*args, "--reads-clients", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+ with", line)]
    assert [row[1] for row in rows] == ["without"] * 2 + ["with"] * 2, out
    for row in rows:
        tasks, reads = (float(x.replace(",", "")) for x in (row[-3], row[-1]))
        assert tasks > 0 and reads > 0, row  # lifecycle and reads ran in every window
    behind = [row[6] for row in rows if row[1] == "with"]
    assert all(b != "-" for b in behind), out  # retention ran, and reported
    assert "lifecycle: worst window with retention" in out
    assert "reads: worst window with retention" in out
