"""The ``troth_postgres_*`` gauges show what a backup or a long report does to
PostgreSQL's horizon: who holds it (for how long, how many transactions behind) and
the dead row versions troth's tables gather meanwhile."""

from __future__ import annotations

import re
import time

import psycopg

from helpers.pg import throwaway_database
from helpers.support import RunningServer, running_server
from troth.server.config import Settings

FAR = 10**13


def gauges(server: RunningServer) -> dict[str, float]:
    r = server.client.get("/metrics")
    assert r.status_code == 200
    found: dict[str, float] = {}
    for m in re.finditer(r"^(troth_postgres_[a-z_]+(?:\{[^}]*\})?) (\S+)$", r.text, re.M):
        found[m.group(1)] = float(m.group(2))
    return found


def test_a_held_snapshot_shows_its_age_its_lag_and_the_dead_rows_it_keeps() -> None:
    with throwaway_database("troth_horizon") as url:
        settings = Settings(store="postgres", postgres_url=url, access_log=False)
        with running_server(settings) as server:
            quiet = gauges(server)
            assert quiet["troth_postgres_horizon_age_seconds"] == 0.0, quiet
            with psycopg.connect(url, application_name="nightly-report") as report:
                report.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                report.execute("SELECT count(*) FROM promises").fetchone()
                held_at = time.monotonic()
                for i in range(20):
                    server.ok("promise.create", {"id": f"p{i}", "timeoutAt": FAR})
                    settle = {"id": f"p{i}", "state": "resolved", "value": {}}
                    server.ok("promise.settle", settle)
                deadline = time.monotonic() + 15
                while True:
                    seen = gauges(server)
                    dead = seen.get('troth_postgres_dead_tuples{table="promises"}', 0.0)
                    if dead >= 20 and time.monotonic() - held_at >= 1:
                        break
                    assert time.monotonic() < deadline, seen
                    time.sleep(0.2)
                assert seen["troth_postgres_horizon_age_seconds"] >= 1.0, seen
                assert seen["troth_postgres_horizon_xids"] >= 40, seen  # 40 writes since
                assert {'troth_postgres_dead_tuples{table="outbox"}'} <= set(seen), seen
                report.execute("COMMIT")
            after = gauges(server)
            assert after["troth_postgres_horizon_age_seconds"] == 0.0, after
