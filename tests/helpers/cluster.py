"""Several ``troth serve`` nodes on one PostgreSQL database, as the SDK crash tests run
them (``sdk/test_cluster_sdk.py`` over HTTP behind a balancer, ``sdk/test_cluster_nats.py``
over a NATS queue group), and what the tests read afterwards: the grants each node
logged, the errors it logged, and what the nodes left in the database.
"""

from __future__ import annotations

import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg

from helpers.sdk_env import Procs
from helpers.troth_process import TrothProcess

GRANT = re.compile(r"troth\.grants acquired task=(\S+) version=(\d+) pid=(\S+)")
SERVER_ERROR = re.compile(r"troth\.access \S+ corrId=\S+ status=5\d\d")


def swarm_value(i: int, fan: int) -> int:
    """What recovery.py's ``swarm(i)`` returns with ``fan`` rpcs after its sleep."""
    return i * i + sum((i + j) ** 2 for j in range(1, fan + 1))


@dataclass(frozen=True)
class Grant:
    node: str
    task: str
    version: int
    pid: str
    at: float  # seconds since the epoch, from the log line


def _stamp(line: str) -> float:
    """The time of a ``logging`` line (``2024-05-01 12:00:00,123 INFO ...``)."""
    day, clock = line.split(" ", 2)[:2]
    return time.mktime(time.strptime(f"{day} {clock[:8]}", "%Y-%m-%d %H:%M:%S")) + (
        int(clock[9:12]) / 1000
    )


class Node(TrothProcess):
    """One ``troth serve --store postgres`` process of the cluster, logging at info."""

    def __init__(self, procs: Procs, name: str, postgres_url: str) -> None:
        super().__init__(procs, name)
        self.postgres_url = postgres_url

    def start(
        self, *extra: str, retry_timeout_ms: int = 1000, env: dict[str, str] | None = None
    ) -> None:
        """Start it; ``extra`` are more ``troth serve`` flags (``--server-url``,
        ``--nats-url``), ``env`` more environment variables."""
        argv = [
            *[sys.executable, "-m", "troth.cli.main", "serve"],
            *["--host", "127.0.0.1", "--port", str(self.port)],
            *["--store", "postgres", "--postgres-url", self.postgres_url],
            *["--node-id", self.name, "--log-level", "info"],
            *["--retry-timeout", str(retry_timeout_ms)],
            *extra,
        ]
        self.proc = self.procs.start(self.name, argv, env)

    def kill_at(self) -> float:
        """SIGKILL it; the wall-clock instant of the kill."""
        self.kill()
        return time.time()

    def metric_lines(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=2).text

    def sse_connections(self) -> int:
        """The node's ``troth_sse_connections`` gauge (its open worker streams)."""
        match = re.search(r"^troth_sse_connections(?:\{\})? (\S+)$", self.metric_lines(), re.M)
        assert match is not None, f"no troth_sse_connections in {self.name}'s metrics"
        return int(float(match[1]))

    def dispatch_outcomes(self) -> dict[str, int]:
        """``troth_dispatch_total`` by outcome: the sends this node made (outcomes it
        never met, exposed at 0 so that ``increase()`` sees their first, left out)."""
        found = re.findall(
            r'^troth_dispatch_total\{outcome="(\w+)"\} (\S+)$', self.metric_lines(), re.M
        )
        return {outcome: int(float(n)) for outcome, n in found if float(n)}

    def grants(self) -> list[Grant]:
        assert self.proc is not None
        out = []
        for line in self.proc.err().splitlines():
            if m := GRANT.search(line):
                out.append(Grant(self.name, m[1], int(m[2]), m[3], _stamp(line)))
        return out

    def problems(self) -> list[str]:
        """Error-level lines, tracebacks and 5xx answers in the node's log."""
        assert self.proc is not None
        bad: list[str] = []
        lines = self.proc.err().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("Traceback"):
                last = next((x for x in lines[i + 1 :] if not x.startswith(" ")), "?")
                bad.append(f"{self.name}: {line} ... {last}")
            elif " ERROR " in line or " CRITICAL " in line or "Exception in" in line:
                bad.append(f"{self.name}: {line}")
            elif SERVER_ERROR.search(line):
                bad.append(f"{self.name}: {line}")  # answered 5xx (logged as a warning)
        return bad


def granted_twice(grants: list[Grant]) -> str | None:
    """Every ``(task, version)`` granted more than once, with who granted it; None if none."""
    twice = {k: c for k, c in Counter((g.task, g.version) for g in grants).items() if c > 1}
    if not twice:
        return None
    return "granted twice: " + "; ".join(
        f"{t} v{v}: "
        + ", ".join(f"{g.node} pid={g.pid}" for g in grants if (g.task, g.version) == (t, v))
        for t, v in twice
    )


def query(postgres_url: str, sql: str, *args: object) -> list[tuple[Any, ...]]:
    """Rows of one query on the cluster's database (to look at what the nodes left)."""
    with psycopg.connect(postgres_url, autocommit=True, connect_timeout=5) as conn:
        return conn.execute(sql, args).fetchall()


def live_nodes(postgres_url: str) -> set[str]:
    """The nodes with a presence row (a dead one's is removed by the survivor)."""
    return {r[0] for r in query(postgres_url, "SELECT node FROM nodes")}


def unsettled_claims(postgres_url: str, node: str) -> int:
    """Outbox rows ``node`` claimed whose send is not settled: still ``dispatching``
    (a claim nobody reaped) or ``outcome_unknown`` (reaped, not yet reconciled)."""
    rows = query(
        postgres_url,
        "SELECT count(*) FROM outbox WHERE claimed_by = %s"
        " AND state IN ('dispatching', 'outcome_unknown')",
        node,
    )
    return int(rows[0][0])
