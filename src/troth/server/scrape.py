"""What ``GET /metrics`` reads from the store and the cluster when it is scraped.

Most metrics are counted as things happen; a few are facts of the shared store that
no single node sees happen: outbox rows by state (``troth_outbox_rows``) and the
nodes whose heartbeat is fresh (``troth_cluster_nodes_alive``).  They are read once
per scrape, off the event loop, before the exposition is rendered.  Counting the
outbox scans it (it holds delivered rows for ``outbox_retention``): a count that took
long is reused for twenty times as long, as ``/ops/counts`` does, so that a
Prometheus scraping every few seconds costs the store at most about 5 % of a core.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Final

from troth.outbox.rows import RowState
from troth.server.cluster import Cluster
from troth.server.metrics import Metrics
from troth.store.base import Store
from troth.store.inspection import Inspection

log = logging.getLogger("troth.server")

#: Seconds a count may take before it is reused (twenty times as long).
SLOW: Final = 0.05
#: Every state is shown, a zero included, so that a panel's series do not come and go.
STATES: Final = tuple(s.value for s in RowState)


class StoreGauges:
    """The scrape-time gauges of one node; :meth:`refresh` before each render."""

    def __init__(self, store: Store, metrics: Metrics, cluster: Cluster | None) -> None:
        self.store = store
        self.cluster = cluster
        self.outbox: dict[str, float] = dict.fromkeys(STATES, 0.0)
        self.nodes_alive = 0.0
        self.reuse_until = 0.0
        metrics.family("troth_outbox_rows", "state", self.outbox_rows)
        if cluster is not None:
            metrics.gauge("troth_cluster_nodes_alive", lambda: self.nodes_alive)

    def outbox_rows(self) -> Mapping[str, float]:
        return self.outbox

    async def refresh(self) -> None:
        """Read the counts (at most once per scrape; a slow count is reused)."""
        at = time.monotonic()
        if at >= self.reuse_until:
            try:
                counts = await asyncio.to_thread(self.store.inspect, _outbox_counts)
            except Exception as exc:  # a scrape never fails for it: the last counts stay
                log.warning("metrics: cannot count outbox rows: %s", exc)
            else:
                self.outbox = {**dict.fromkeys(STATES, 0.0), **counts}
                took = time.monotonic() - at
                self.reuse_until = at + 20 * took if took > SLOW else 0.0
        if self.cluster is not None:
            try:
                view = await self.cluster.view()
            except Exception as exc:
                log.warning("metrics: cannot read the cluster's nodes: %s", exc)
            else:
                self.nodes_alive = float(sum(1 for n in view.nodes if n.alive))


def _outbox_counts(ins: Inspection) -> dict[str, float]:
    return {state: float(n) for state, n in ins.outbox_counts().items()}
