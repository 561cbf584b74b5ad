"""The connections a node opens are the ones docs/operations.md lists ("Connections").

The table there is read by this test: for each ``application_name`` it names, the
count a node shows in ``pg_stat_activity`` after serving a write, a read and a
delivery must be what the table says — with ``postgres_readers`` as set, and the
on-demand connections (operator reads, retention, the startup probe) absent, since
nothing here asks for them.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from helpers.pg import ADMIN_URL, dbname_of, throwaway_database
from helpers.support import running_server
from troth.server.config import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
FAR = 10**13


def documented(readers: int) -> dict[str, int]:
    """``application_name`` (without its ``:{node}``) -> connections in steady use,
    from the doc's table."""
    section = DOC.read_text().split("### Connections", 1)[1].split("\n### ", 1)[0]
    counts: dict[str, int] = {}
    for name, how_many in re.findall(r"^\| `([\w-]+):?(?:\{node\})?` \| ([^|]+) \|", section, re.M):
        how_many = how_many.strip()
        if how_many == "1":
            counts[name] = 1
        elif how_many.startswith("`postgres_readers`"):
            counts[name] = readers
        else:  # on demand: "0–1", "2, for a moment"
            counts[name] = 0
    assert {"troth", "troth-read", "troth-outbox", "troth-cluster", "troth-listen"} <= set(
        counts
    ), counts
    return counts


def in_use(database: str) -> Counter[str]:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE datname = %s AND pid <> "
            "pg_backend_pid()",
            (database,),
        ).fetchall()
    return Counter(str(r[0]).split(":", 1)[0] for r in rows)


@pytest.mark.parametrize("readers", [1, 0])
def test_a_nodes_connections_are_the_documented_ones(readers: int) -> None:
    with throwaway_database("troth_conns") as url:
        settings = Settings(
            store="postgres",
            postgres_url=url,
            postgres_readers=readers,
            node_id="counted",
            debug=True,
            access_log=False,
        )
        with running_server(settings) as node:
            node.ok("debug.stop", {})  # run the timer and delivery loops
            node.ok(
                "promise.create",
                {"id": "p", "timeoutAt": FAR, "tags": {"resonate:target": "poll://any@g"}},
            )
            assert node.ok("promise.get", {"id": "p"})["promise"]["id"] == "p"
            expected = {name: n for name, n in documented(readers).items() if n}
            deadline = time.monotonic() + 10
            while (seen := dict(in_use(dbname_of(url)))) != expected:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert seen == expected
