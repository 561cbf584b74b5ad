"""What ``GET /metrics`` reads from the store and the cluster when it is scraped.

Most metrics are counted as things happen; a few are facts of the shared store that
no single node sees happen: outbox rows by state (``troth_outbox_rows``), the nodes
whose heartbeat is fresh (``troth_cluster_nodes_alive``), what holds PostgreSQL's
horizon back and the dead tuples it left (``troth_postgres_*``) and, while some worker group
has a limit, each limit with its use (``troth_limit_concurrency``, ``_in_use``,
``_held``, by group: troth/flow).  They are read once per scrape, off the event loop
and off the writer (one read-only snapshot, ``Store.inspect``), before the exposition
is rendered; the request path pays nothing for them.  Counting the outbox scans it
(it holds delivered rows for ``outbox_retention``): a count that took long is reused
for twenty times as long, as ``/ops/counts`` does, so that a Prometheus scraping
every few seconds costs the store at most about 5 % of a core.  The limits are read
fresh each time: a count of each group's slots and queue, two index ranges.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Final

from troth.flow.gate import Flow
from troth.outbox.rows import RowState
from troth.server.delivery.cluster import Cluster, Horizon
from troth.server.metrics import Metrics
from troth.store.base import Store
from troth.store.inspection import Inspection, LimitUse

log = logging.getLogger("troth.server")

#: Seconds a count may take before it is reused (twenty times as long).
SLOW: Final = 0.05
#: Every state is shown, a zero included, so that a panel's series do not come and go.
STATES: Final = tuple(s.value for s in RowState)
#: The gauges of each limit, by group (troth/flow).
LIMIT_CONCURRENCY: Final = "troth_limit_concurrency"
LIMIT_RATE: Final = "troth_limit_rate"
LIMIT_IN_USE: Final = "troth_limit_in_use"
LIMIT_HELD: Final = "troth_limit_held"


class StoreGauges:
    """The scrape-time gauges of one node; :meth:`refresh` before each render."""

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        cluster: Cluster | None,
        flow: Flow | None = None,
    ) -> None:
        self.store = store
        self.cluster = cluster
        #: The engine's limits: the store is read for them only while there are some.
        self.flow = flow
        self.outbox: dict[str, float] = dict.fromkeys(STATES, 0.0)
        self.limits: list[LimitUse] = []
        self.nodes_alive = 0.0
        self.reuse_until = 0.0
        metrics.family("troth_outbox_rows", "state", self.outbox_rows)
        self.horizon = Horizon(0.0, 0, {})
        if cluster is not None:
            metrics.gauge("troth_cluster_nodes_alive", lambda: self.nodes_alive)
            metrics.gauge("troth_postgres_horizon_age_seconds", lambda: self.horizon.age)
            metrics.gauge("troth_postgres_horizon_xids", lambda: float(self.horizon.xids))
            metrics.family(
                "troth_postgres_dead_tuples",
                "table",
                lambda: {t: float(n) for t, n in self.horizon.dead.items()},
            )
        if flow is not None:
            metrics.family(
                LIMIT_CONCURRENCY,
                "group",
                lambda: {u.group: u.concurrency for u in self.limits if u.concurrency is not None},
            )
            metrics.family(
                LIMIT_RATE,
                "group",
                lambda: {u.group: u.rate for u in self.limits if u.rate is not None},
            )
            metrics.family(LIMIT_IN_USE, "group", lambda: {u.group: u.in_use for u in self.limits})
            metrics.family(LIMIT_HELD, "group", lambda: {u.group: u.held for u in self.limits})

    def outbox_rows(self) -> Mapping[str, float]:
        return self.outbox

    async def refresh(self) -> None:
        """Read the counts (at most once per scrape; a slow outbox count is reused),
        in one snapshot of the store."""
        at = time.monotonic()
        outbox = at >= self.reuse_until
        limited = self.flow is not None and bool(self.flow.limits)
        if not limited:
            self.limits = []  # no limit now: no series (a deleted one's go too)
        if outbox or limited:
            try:
                counts, limits = await asyncio.to_thread(
                    self.store.inspect, lambda ins: _read(ins, outbox, limited)
                )
            except Exception as exc:  # a scrape never fails for it: the last counts stay
                log.warning("metrics: cannot read the store's counts: %s", exc)
            else:
                if counts is not None:
                    self.outbox = {**dict.fromkeys(STATES, 0.0), **counts}
                    took = time.monotonic() - at
                    self.reuse_until = at + 20 * took if took > SLOW else 0.0
                if limits is not None:
                    self.limits = limits
        if self.cluster is not None:
            try:
                view = await self.cluster.view()
            except Exception as exc:
                log.warning("metrics: cannot read the cluster's nodes: %s", exc)
            else:
                self.nodes_alive = float(sum(1 for n in view.nodes if n.alive))
            try:
                self.horizon = await self.cluster.horizon()
            except Exception as exc:
                log.warning("metrics: cannot read what holds the horizon back: %s", exc)


def _read(
    ins: Inspection, outbox: bool, limits: bool
) -> tuple[dict[str, float] | None, list[LimitUse] | None]:
    """The outbox's rows by state and the limits with their use, those asked for."""
    counts = {s: float(n) for s, n in ins.outbox_counts().items()} if outbox else None
    return counts, ins.limits() if limits else None
