"""The horizon lab's sampler (``--sample``): what PostgreSQL's backends are busy with,
and what they wait on, per phase of the run."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from helpers.pg import throwaway_database
from troth_bench.horizon_windows import Sampler


def test_the_sampler_names_the_statement_and_what_it_waits_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with throwaway_database("troth_sampler") as url:
        sampler = Sampler(url)
        sampler.phase = "held"
        sampler.thread.start()
        done = threading.Event()

        def sleeper() -> None:
            with psycopg.connect(url, application_name="sleeper") as conn:
                conn.execute("SELECT pg_sleep(1.0)")
            done.set()

        thread = threading.Thread(target=sleeper)
        thread.start()
        thread.join(10)
        assert done.is_set()
        time.sleep(0.05)  # at least one sample after the sleep ended
        sampler.stopped.set()
        sampler.thread.join(5)
        sampler.report()
    out = capsys.readouterr().out
    busy = out.split("-- busy backends while held (", 1)[1].split("--", 1)[0]
    waits = out.split("-- busy backends while held, waiting on (", 1)[1]
    assert "sleeper: SELECT pg_sleep(1.0)" in busy, out
    share = float(waits.split("Timeout:PgSleep")[0].split()[-1].rstrip("%"))
    assert 50 <= share <= 100, out  # the sleep was active for most of the sampled time
