"""The figures a run produces, in a form both the table and ``--json`` print."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from troth_bench.measure import CpuShare, Samples


@dataclass
class Series:
    """One line of a table: a rate over the window and/or a latency distribution.

    ``seconds`` is None for a latency-only line (dispatch latency, timer lag)."""

    name: str
    unit: str
    count: int
    seconds: float | None
    latency: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float | None:
        if self.seconds is None or self.seconds <= 0:
            return None
        return self.count / self.seconds

    @classmethod
    def of(cls, name: str, unit: str, samples: Samples, seconds: float | None) -> Series:
        return cls(name, unit, len(samples.values), seconds, samples.percentiles())


@dataclass
class Result:
    """One workload: its lines, what the server and generator spent, what was checked."""

    name: str
    headline: str  # the series the summary shows
    series: list[Series]
    cpu: CpuShare = field(default_factory=CpuShare)
    rss_max: int | None = None
    commits_per_s: float | None = None
    jobs_per_commit: float | None = None
    checks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    context: str = ""  # e.g. "1,000,000 stored" in a scale run, "2 nodes" on postgres
    nodes: int = 1  # troth processes the figures are summed over
    peer: str = ""  # not troth: the peer measured in the same run (e.g. "pgqueuer")

    def line(self, name: str) -> Series | None:
        for s in self.series:
            if s.name == name:
                return s
        return None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["cpu"]["server"] = self.cpu.server
        out["cpu"]["elsewhere"] = self.cpu.elsewhere
        for s, j in zip(self.series, out["series"], strict=True):
            j["rate"] = s.rate
        return out


@dataclass
class Limits:
    """The ceilings measured in the same run, on the same machine and file system."""

    sqlite_commits: float | None = None  # single-row durable commits per second
    sqlite_commit_latency: dict[str, float] = field(default_factory=dict)
    sqlite_rows: float | None = None  # rows per second in 100-row transactions
    http: Series | None = None  # the bare round trip
    http_cpu: CpuShare = field(default_factory=CpuShare)
    # PostgreSQL (--store postgres): the same server, a throwaway database.
    pg_method: str | None = None  # "pgbench" or the psycopg fallback
    pg_clients: int = 0  # connections of the one-row probe (the run's --clients)
    pg_commits: float | None = None  # one-row transactions/s on pg_clients connections
    pg_commit_latency: dict[str, float] = field(default_factory=dict)
    pg_serial: float | None = None  # one-row transactions/s on one connection
    pg_serial_latency: dict[str, float] = field(default_factory=dict)
    pg_rows: float | None = None  # rows/s in 100-row transactions, one connection
    #: The machine ceiling (troth_bench.ceiling): nginx driven by wrk and by the
    #: bench's generator; why it was not measured, when it was not.
    nginx_wrk: Series | None = None
    nginx_generator: Series | None = None
    nginx_cpu: float | None = None  # nginx's cores under wrk
    nginx_generator_cpu: float | None = None  # the generator's cores against nginx
    nginx_skipped: str | None = None

    @property
    def one_row(self) -> float | None:
        """The one-row durable commit ceiling of the store under test."""
        return self.pg_commits if self.pg_method else self.sqlite_commits

    @property
    def batched_rows(self) -> float | None:
        """The 100-rows-per-commit ceiling of the store under test."""
        return self.pg_rows if self.pg_method else self.sqlite_rows

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.http is not None:
            out["http"]["rate"] = self.http.rate
        return out


@dataclass
class ScalePoint:
    """Figures on a database seeded with ``stored`` settled promises."""

    stored: int
    seed_seconds: float
    db_bytes: int
    rss_at_rest: int | None
    results: list[Result] = field(default_factory=list)
    rss_after: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "stored": self.stored,
            "seed_seconds": self.seed_seconds,
            "db_bytes": self.db_bytes,
            "rss_at_rest": self.rss_at_rest,
            "rss_after": self.rss_after,
            "results": [r.to_json() for r in self.results],
        }
