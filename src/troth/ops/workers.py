"""Who is connected where: worker connections and nodes, as the operator API shows
them (``/ops/workers``, ``troth explain``).

One node (SQLite, memory) answers from its own connection registry; several nodes on
PostgreSQL answer from the ``nodes``, ``connections`` and ``worker_groups`` tables
(server/delivery/cluster.py), so any node shows the whole cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from troth import __version__
from troth.transport.poll import Registry


@dataclass(frozen=True)
class WorkerInfo:
    """An open SSE connection of ``group``/``pid`` on ``node`` since ``since`` (ms)."""

    group: str
    pid: str
    node: str
    since: int | None


@dataclass(frozen=True)
class NodeInfo:
    node: str
    url: str
    started_at: int
    seen_at: int
    alive: bool
    #: The troth release and schema version the node runs; None for a node of a
    #: release that did not record them.
    release: str | None = None
    schema: int | None = None


@dataclass
class ClusterView:
    """Nodes, connections, and when each group last had a connection (ms)."""

    nodes: list[NodeInfo] = field(default_factory=list)
    connections: list[WorkerInfo] = field(default_factory=list)
    last_seen: dict[str, int] = field(default_factory=dict)
    #: The clock these instants were read against (the database's, on PostgreSQL).
    now: int | None = None
    #: Since when ``last_seen`` remembers (one node: since it started; None: the
    #: database keeps it across restarts).
    remembers_since: int | None = None
    #: The answering node's NATS connection (``nats://`` deliveries): ``off`` (no
    #: ``nats_url``), ``connected`` or ``disconnected``; None when not told.
    nats: str | None = None

    def connected(self, group: str, pid: str | None = None) -> list[WorkerInfo]:
        """Connections of a group (case-insensitive, as poll groups are), or of one pid
        in it; only on live nodes."""
        dead = {n.node for n in self.nodes if not n.alive}
        g = group.lower()
        return [
            c
            for c in self.connections
            if c.group == g and (pid is None or c.pid == pid) and c.node not in dead
        ]

    def holding(self, pid: str) -> list[WorkerInfo]:
        """Connections of a pid in any group (who holds a task's lease, and where)."""
        dead = {n.node for n in self.nodes if not n.alive}
        return [c for c in self.connections if c.pid == pid and c.node not in dead]


def local_view(
    registry: Registry,
    node: str,
    url: str,
    started_at: int,
    now: int,
    schema: int | None = None,
) -> ClusterView:
    """One node's view from its registry."""
    return ClusterView(
        nodes=[NodeInfo(node, url, started_at, now, True, release=__version__, schema=schema)],
        connections=[
            WorkerInfo(c.group, c.id, node, c.since)
            for members in registry.groups.values()
            for conns in members.values()
            for c in conns
            if not c.closed
        ],
        last_seen=dict(registry.last_seen),
        now=now,
        remembers_since=started_at,
    )
