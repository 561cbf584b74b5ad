"""Prometheus metrics: counters, histograms and gauges in the text format, served at
``GET /metrics``.

Small on purpose: updates are a dict lookup and an add on the event loop thread (or
under a lock from the writer thread); rendering happens only when scraped.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Mapping

from troth.outbox import codes

Labels = tuple[tuple[str, str], ...]

#: Latency buckets in seconds, from 0.25 ms to 10 s.
BUCKETS = (
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    10.0,
)

#: ``troth_dispatch_total``'s outcomes and ``troth_outbox_reconciled_total``'s verdicts
#: (server/delivery/loop.py).
DISPATCH_OUTCOMES = ("completed", "retried", "failed", "unknown", "unsettled")
RECONCILE_VERDICTS = ("completed", "failed", "resent", "unresolved")
#: ``troth_store_write_errors_total``'s reasons.
STORE_WRITE_ERRORS = ("disk_full", "read_only", "unavailable")

HELP = {
    "troth_requests_total": ("counter", "Protocol requests answered, by kind and status."),
    "troth_request_seconds": ("histogram", "Time to answer a protocol request, by kind."),
    "troth_dispatch_total": ("counter", "Outbox sends settled, by outcome."),
    "troth_dispatch_send_seconds": ("histogram", "Time one outbox send took."),
    "troth_outbox_claims_released_total": ("counter", "Expired dispatcher claims reaped."),
    "troth_outbox_reconciled_total": ("counter", "Unknown outbox rows reconciled, by verdict."),
    "troth_sse_connections": ("gauge", "Open SSE (poll) connections."),
    "troth_undeliverable_total": (
        "counter",
        "Outbox sends to an address this node has no transport for, by code.",
    ),
    "troth_commit_batches_total": ("counter", "Store transactions committed by the writer."),
    "troth_commit_jobs_total": ("counter", "Jobs (requests, timer passes) in those transactions."),
    "troth_task_bounces_total": (
        "counter",
        "task.release answered 200: a task given back without progress (a bounce).",
    ),
    "troth_task_backoffs_total": (
        "counter",
        "Bounces whose re-emitted execute was held back (the bounce backoff).",
    ),
    "troth_tasks_in_backoff": (
        "gauge",
        "Tasks bouncing without progress whose execute is being held back (this node).",
    ),
    "troth_timer_passes_total": ("counter", "Timer passes that fired due internal steps."),
    "troth_timer_lag_seconds": (
        "gauge",
        "How late the last firing timer pass ran after the earliest deadline it fired.",
    ),
    "troth_retention_trees_deleted_total": ("counter", "Workflows deleted by retention."),
    "troth_retention_rows_deleted_total": ("counter", "Rows deleted by retention, by table."),
    "troth_retention_passes_total": ("counter", "Retention passes over every candidate root."),
    "troth_retention_behind_seconds": (
        "gauge",
        "How long past the horizon the oldest workflow of the last batch had waited.",
    ),
    "troth_retention_last_run_timestamp_seconds": ("gauge", "When retention last ran a batch."),
    "troth_store_writable": ("gauge", "1 while the store takes writes, 0 while it refuses them."),
    "troth_store_write_errors_total": (
        "counter",
        "Commits the store refused (a batch, a timer pass, a probe, delivery, retention), "
        "by reason: disk_full, read_only, unavailable.",
    ),
    "troth_clock_jumps_total": ("counter", "Steps of the wall clock the timer noticed."),
    "troth_clock_last_jump_seconds": (
        "gauge",
        "The last step of the wall clock, in seconds (negative: backwards).",
    ),
    "troth_store_batch_reruns": (
        "gauge",
        "Batches re-run after a conflict with another writer (PostgreSQL), since start.",
    ),
    "troth_cluster_notifications_heard": (
        "gauge",
        "Commit notifications heard from other nodes, since start.",
    ),
    "troth_outbox_rows": (
        "gauge",
        "Outbox rows by state, in the whole store (counted when scraped; reused for a "
        "while when counting is slow).",
    ),
    "troth_cluster_nodes_alive": (
        "gauge",
        "Nodes of the cluster whose heartbeat is fresh, this one included (PostgreSQL).",
    ),
    "troth_postgres_horizon_age_seconds": (
        "gauge",
        "Seconds since the oldest transaction of another application that holds back "
        "PostgreSQL's xmin horizon began (a backup, a long query, a session idle in "
        "transaction; 0: none).",
    ),
    "troth_postgres_horizon_xids": (
        "gauge",
        "Transactions by which the oldest holder of the xmin horizon lags, replication "
        "slots and prepared transactions included.",
    ),
    "troth_postgres_dead_tuples": (
        "gauge",
        "Dead row versions in troth's hot tables, by table, as PostgreSQL's statistics count them.",
    ),
    "troth_limit_concurrency": (
        "gauge",
        "The concurrency limit of a worker group: at most this many of its tasks hold a "
        "slot at once (read from the store when scraped, while some group has a limit).",
    ),
    "troth_limit_rate": (
        "gauge",
        "The rate limit of a worker group: at most this many of its tasks start per "
        "second on average (read from the store when scraped).",
    ),
    "troth_limit_in_use": (
        "gauge",
        "Tasks of a limited worker group holding a slot: acquired, or their execute sent "
        "and not yet acquired.",
    ),
    "troth_limit_held": (
        "gauge",
        "Tasks of a limited worker group held for a slot: pending, no execute sent.",
    ),
    "troth_cluster_claims_reaped": (
        "gauge",
        "Outbox claims of dead nodes this node moved to outcome_unknown, since start.",
    ),
}


#: Counter series shown from the start at 0, so that ``rate`` and ``increase`` (the
#: alert rules, deploy/prometheus/alerts.yml) see their first event: a series that
#: first appears at 1 has no increase Prometheus can compute.
START_AT_ZERO: tuple[tuple[str, Labels], ...] = (
    *(("troth_dispatch_total", (("outcome", o),)) for o in DISPATCH_OUTCOMES),
    *(("troth_outbox_reconciled_total", (("verdict", v),)) for v in RECONCILE_VERDICTS),
    *(("troth_undeliverable_total", (("code", c),)) for c in (codes.BAD_ADDRESS, codes.NATS_OFF)),
    ("troth_outbox_claims_released_total", ()),
    ("troth_task_bounces_total", ()),
    ("troth_task_backoffs_total", ()),
    ("troth_commit_batches_total", ()),
    ("troth_commit_jobs_total", ()),
    # Counted by the store's health check; at 0 from the start so that the storage
    # alerts see the first failed write.
    *(("troth_store_write_errors_total", (("reason", r),)) for r in STORE_WRITE_ERRORS),
)


class Histogram:
    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, value)] += 1
        self.sum += value


#: A (kind, status)'s counter series, its label tuple, and its kind's histogram.
_RequestSlot = tuple[dict[Labels, float], Labels, Histogram]


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counters: dict[str, dict[Labels, float]] = {}
        self.histograms: dict[str, dict[Labels, Histogram]] = {}
        self.gauges: dict[str, Callable[[], float]] = {}
        #: Gauges with one label: ``name -> (label, read)``, ``read`` giving a value
        #: per label value.
        self.families: dict[str, tuple[str, Callable[[], Mapping[str, float]]]] = {}
        self._request_slots: dict[tuple[str, int], _RequestSlot] = {}
        for name, key in START_AT_ZERO:
            self.counters.setdefault(name, {})[key] = 0

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        self._count(name, tuple(sorted(labels.items())), amount)

    def _count(self, name: str, key: Labels, amount: float) -> None:
        with self.lock:
            series = self.counters.setdefault(name, {})
            series[key] = series.get(key, 0) + amount

    def request(self, kind: str, status: int, seconds: float) -> None:
        """One answered request: ``troth_requests_total{kind,status}`` and
        ``troth_request_seconds{kind}``, as :meth:`inc` and :meth:`observe` count
        them.  Every request passes here, so each (kind, status) finds its counter's
        series, label tuple and histogram made once, and both are counted under one
        lock (building and sorting labels, and a lookup per metric, cost more than
        the counting)."""
        slot = self._request_slots.get((kind, status))
        if slot is None:
            slot = self._request_slot(kind, status)
        counts, key, histogram = slot
        with self.lock:
            counts[key] = counts.get(key, 0) + 1
            histogram.observe(seconds)

    def _request_slot(self, kind: str, status: int) -> _RequestSlot:
        counted = (("kind", kind), ("status", str(status)))
        timed = (("kind", kind),)
        with self.lock:
            counts = self.counters.setdefault("troth_requests_total", {})
            series = self.histograms.setdefault("troth_request_seconds", {})
            histogram = series.get(timed)
            if histogram is None:
                histogram = series[timed] = Histogram()
        slot = self._request_slots[(kind, status)] = (counts, counted, histogram)
        return slot

    def observe(self, name: str, value: float, **labels: str) -> None:
        self._observe(name, tuple(sorted(labels.items())), value)

    def _observe(self, name: str, key: Labels, value: float) -> None:
        with self.lock:
            series = self.histograms.setdefault(name, {})
            h = series.get(key)
            if h is None:
                h = series[key] = Histogram()
            h.observe(value)

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        self.gauges[name] = read

    def family(self, name: str, label: str, read: Callable[[], Mapping[str, float]]) -> None:
        """A gauge with one label, read when scraped: ``read()`` gives each value."""
        self.families[name] = (label, read)

    def value(self, name: str, **labels: str) -> float:
        """A counter's current value (for tests and the CLI)."""
        with self.lock:
            return self.counters.get(name, {}).get(tuple(sorted(labels.items())), 0)

    def render(self) -> str:
        lines: list[str] = []

        def header(name: str, kind: str) -> None:
            text = HELP.get(name, (kind, name))[1]
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")

        with self.lock:
            for name in sorted(self.counters):
                header(name, "counter")
                for labels, v in sorted(self.counters[name].items()):
                    lines.append(f"{name}{fmt(labels)} {number(v)}")
            for name in sorted(self.histograms):
                header(name, "histogram")
                for labels, h in sorted(self.histograms[name].items()):
                    running = 0
                    for bound, count in zip((*BUCKETS, float("inf")), h.counts, strict=True):
                        running += count
                        le = "+Inf" if bound == float("inf") else f"{bound:g}"
                        lines.append(f"{name}_bucket{fmt((*labels, ('le', le)))} {running}")
                    lines.append(f"{name}_sum{fmt(labels)} {h.sum:.6f}")
                    lines.append(f"{name}_count{fmt(labels)} {running}")
        for name in sorted(self.gauges):
            # A count read by a callback is still a counter (``…_total``).
            header(name, HELP.get(name, ("gauge", ""))[0])
            lines.append(f"{name} {number(self.gauges[name]())}")
        for name in sorted(self.families):
            label, read = self.families[name]
            values = read()
            if not values:
                continue  # no series now (no limit set): no header for none
            header(name, "gauge")
            for value, v in sorted(values.items()):
                lines.append(f"{name}{fmt(((label, value),))} {number(v)}")
        return "\n".join(lines) + "\n"


def number(v: float) -> str:
    """Exact text for a sample: integers without an exponent, floats by ``repr``."""
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def fmt(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{escape(v)}"' for k, v in labels)
    return "{" + inner + "}"


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
