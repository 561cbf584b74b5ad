"""Membership of one troth node among several sharing a PostgreSQL database.

Every node serves ``POST /`` and SSE connections.  A message for a ``poll://``
address must be delivered by a node that holds a matching connection, wherever the
request that produced it was served.  How:

* **Presence.**  Each node writes which ``(group, id)`` it holds connections for
  into ``connections`` (synchronously when a worker connects, before the stream's
  first byte, so a request the worker sends next already finds it), and heartbeats
  its ``nodes`` row every ``node_timeout / 5`` seconds, on the database's clock.
* **Claims.**  The outbox is claimed through ``PostgresOutbox.routing``: a node takes
  the ``poll://`` rows it can deliver itself, plus rows no live node can deliver
  (tried, found undeliverable, backed off — as on one node); http(s) rows go to any
  node.  ``FOR UPDATE SKIP LOCKED`` keeps two nodes off the same row.
* **Wake-ups.**  Right after a commit, on the writer thread, the node first claims
  what it can deliver itself; if messages of that commit are left, it sends
  ``NOTIFY troth`` (on the outbox connection, ``PostgresOutbox.notify``), and so it
  does for a deadline earlier than the one its timer sleeps until.  Every node
  LISTENs (on ``postgres_listen_url`` when set: behind a pooler in transaction
  mode LISTEN needs a direct connection, and without one the node does not
  listen): the node holding the connection sweeps at once, every timer learns of
  earlier deadlines.  Not in the batch's own transaction: a notifying COMMIT takes
  a database-wide lock through its WAL flush, which would serialise the writers'
  commits across nodes.  No polling on the hot path: the delivery loop's 1 s
  maintenance sweep and a timer re-read every 5 s are the fallbacks, for a
  notification lost while a connection was down or by a node that died between
  its commit and its announcement.
* **Death.**  A node whose heartbeat is older than ``node_timeout`` is dead: its
  connections stop counting at once (its workers reconnect to another node, which
  then claims their messages), and the first live node to notice moves the dead
  node's outbox claims to ``outcome_unknown`` (they may have been sent), where
  reconciliation settles or resends them — instead of waiting out the claim timeout.
  A node that was only slow re-registers with its next heartbeat; its late
  settlements are refused by the claim token, as for any reaped claim.
* **No message is stranded.**  While no live node holds a stream — its node
  presumed dead (cut off from the database, not crashed), or its worker between
  two connections — a message for it is tried, found undeliverable and backed off
  (``troth.poll.no_connection``), and fails once its attempts are exhausted.  So
  whenever a node publishes a stream (a worker connects; a node presumed dead
  rejoins and republishes every stream it still holds), the messages for exactly
  that ``group/id`` which no node could deliver are offered again
  (``connections_revive``): those backed off come due at once, those that failed
  within :data:`REVIVE_WINDOW` seconds become pending again — at once, and once
  more at a heartbeat soon after (a peer's send under way at that moment settles
  after it).  An ``unblock`` then
  reaches its listener within moments of the heal, not when the SDK re-registers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from troth import __version__
from troth.engine import Engine
from troth.ops.workers import ClusterView, NodeInfo, WorkerInfo
from troth.outbox import codes
from troth.server.delivery.loop import DeliveryLoop
from troth.store.outbox import REVIVE_WINDOW
from troth.store.postgres import CHANNEL, PostgresStore, Routing
from troth.store.postgres.migrate import PACKAGE
from troth.store.postgres.timeouts import with_timeouts
from troth.store.sql.migrate import load_migrations
from troth.store.sql.queries import load_queries
from troth.transport.poll import Registry
from troth.waiting import wait_event

log = logging.getLogger("troth.cluster")

AsyncConn = psycopg.AsyncConnection[tuple[Any, ...]]

#: Seconds a starting node waits to be listening before it serves anyway.
LISTEN_WAIT = 10.0
#: Seconds after a publish before its streams are offered again once more.
AGAIN_AFTER = 0.5

#: Membership queries (``store/postgres/queries.sql``).
_Q: Final = load_queries("troth.store.postgres")


def default_node_id() -> str:
    """Host, pid and a random suffix: unique across restarts and machines."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class Horizon:
    """What :meth:`Cluster.horizon` read."""

    #: Seconds since the oldest transaction of another application holding a
    #: snapshot or an xid began (0: none).
    age: float
    #: Transactions the oldest holder lags, replication slots included.
    xids: int
    #: Dead tuples of the hot tables, by table.
    dead: dict[str, int]


class Cluster:
    """One node's membership: presence, heartbeat, dead-node reaping, LISTEN.

    Unlike the engine's and the delivery's hooks, which they are given when they are
    made (``server/run.build_app``), the cluster's are attached by :meth:`start` and
    taken back by :meth:`stop`: the store's claim routing, the delivery's
    ``announce``, the engine's ``on_deadline`` and the registry's ``on_change``.
    That is the membership's own lifecycle, not wiring put off: the node is a member
    only from its registration to its leave, and announcing messages or deadlines to
    peers, or publishing streams, means something only in between.  The objects it
    attaches to are made first and work alone (a node of its own has no cluster, and
    their hooks stay None: one ``is not None`` on the writer thread); giving them the
    hooks at construction would take late-bound calls into an object that may not
    exist, and a "joined" flag each hook checks, for what start and stop say now.
    """

    def __init__(
        self,
        store: PostgresStore,
        engine: Engine,
        registry: Registry,
        delivery: DeliveryLoop,
        *,
        node: str,
        url: str,
        node_timeout: float,
        listen_url: str = "",
    ) -> None:
        if node_timeout <= 0:
            raise ValueError("node_timeout must be > 0 (seconds)")
        self.store = store
        self.engine = engine
        self.registry = registry
        self.delivery = delivery
        self.node = node
        self.url = url
        self.node_timeout = node_timeout
        #: Where LISTEN connects: it needs a session, which a pooler in transaction
        #: mode does not keep (the store's URL serves when it is not pooled).
        self.listen_url = listen_url or ("" if store.pooled else store.url)
        self.heartbeat_every = node_timeout / 5
        self._reach: tuple[list[str], list[str]] = ([], [])
        self._published: set[tuple[str, str]] = set()
        #: Streams published lately, and when (``loop.time()``): offered again once
        #: more by the first heartbeat :data:`AGAIN_AFTER` seconds later.
        self._again: dict[tuple[str, str], float] = {}
        self._write: AsyncConn | None = None
        self._lock = asyncio.Lock()
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._listening = asyncio.Event()
        self.heard = 0  # notifications from other nodes (tests, diagnostics)
        self.deadlines_heard = 0  # of which announced a deadline (hinted to the timer)
        self.reaped = 0  # claims of dead nodes moved to outcome_unknown

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Register, route claims through this node's reach, attach the membership's
        hooks (see the class), start listening."""
        async with self._lock:
            conn = await self._writer()
            await conn.execute(_Q["node_register"], self._registration())
            await conn.execute(_Q["connections_forget"], (self.node,))
        self.store.outbox.routing = Routing(
            self.node, round(self.node_timeout * 1000), lambda: self._reach
        )
        self.delivery.announce = self.announce_unclaimed
        self.engine.on_deadline = self.announce_deadline
        self.registry.on_change = self._changed
        self._changed()
        self._tasks = [asyncio.create_task(self._heartbeat(), name="troth-cluster-heartbeat")]
        if not self.listen_url:
            log.warning(
                "node %s does not LISTEN: postgres_pool_mode is transaction and no "
                "postgres_listen_url names a direct connection; other nodes' messages "
                "and deadlines reach it by the 1 s sweep and the 5 s timer re-read",
                self.node,
            )
            self._listening.set()
        else:
            self._tasks.append(asyncio.create_task(self._listen(), name="troth-cluster-listen"))
        # Serve only once peers' announcements can be heard (they are not replayed).
        if not await wait_event(self._listening, LISTEN_WAIT):
            log.warning("node %s serves before it could LISTEN; it keeps trying", self.node)
        log.info("node %s joined (node_timeout %.1f s)", self.node, self.node_timeout)

    async def stop(self) -> None:
        """Leave: peers stop routing to this node at once, not after node_timeout.
        The hooks :meth:`start` attached are taken back before it deregisters: a
        node that left announces nothing and publishes no stream."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks = []
        self.registry.on_change = None
        self.delivery.announce = None
        self.engine.on_deadline = None
        async with self._lock:
            try:
                conn = await self._writer()
                await conn.execute(_Q["node_leave"], (self.node,))
            except (psycopg.Error, OSError) as exc:
                log.warning("could not deregister node %s: %s", self.node, exc)
            await self._close_writer()

    def _registration(self) -> tuple[str, str, str, int]:
        """The ``nodes`` row's values: this node's release and schema beside its name,
        so that an operator sees which nodes still run an older troth."""
        return (self.node, self.url, __version__, len(load_migrations(PACKAGE)))

    # -- presence ---------------------------------------------------------------------

    def reach(self) -> tuple[list[str], list[str]]:
        """Groups and ``group/id`` pairs held here (any thread: an atomic read)."""
        return self._reach

    def _changed(self) -> None:
        groups = self.registry.groups
        self._reach = (
            sorted(groups),
            sorted(f"{g}/{id}" for g, members in groups.items() for id in members),
        )
        self._dirty.set()

    async def publish(self) -> None:
        """Bring ``connections`` in line with the registry.  On failure it raises and
        the next heartbeat tries again; meanwhile this node still claims what it holds
        (its own claims read the registry, not the table)."""
        async with self._lock:
            self._dirty.clear()
            held = {(g, id) for g, members in self.registry.groups.items() for id in members}
            added, gone = held - self._published, self._published - held
            if not added and not gone:
                return
            try:
                conn = await self._writer()
                async with conn.transaction(), conn.cursor() as cur:
                    if added:
                        await cur.executemany(
                            _Q["connection_add"],
                            [{"node": self.node, "grp": g, "pid": id} for g, id in sorted(added)],
                        )
                    if gone:
                        await cur.executemany(
                            _Q["connection_drop"],
                            [{"node": self.node, "grp": g, "pid": id} for g, id in sorted(gone)],
                        )
            except BaseException:
                await self._close_writer()
                self._dirty.set()
                raise
            self._published = held
            if added:
                await self._revive(conn, added)
                now = asyncio.get_running_loop().time()
                self._again.update((pair, now) for pair in added)

    async def _revive(self, conn: AsyncConn, added: set[tuple[str, str]]) -> None:
        """Offer again what no node could deliver to the streams just published (see
        the module's docstring); a failure is only logged (it is a courtesy: a
        request's pending row of the same key may have got there first)."""
        now = self.engine.clock()
        params = {
            "pairs": [f"{g}/{id}" for g, id in sorted(added)],
            "now": now,
            "since": now - round(REVIVE_WINDOW * 1000),
            "no_connection": codes.NO_CONNECTION,
            "exhausted": codes.ATTEMPTS_EXHAUSTED,
        }
        try:
            cur = await conn.execute(_Q["connections_revive"], params)
            found = await cur.fetchone()
        except psycopg.Error as exc:
            log.warning("could not offer again the messages for %d streams: %s", len(added), exc)
            return
        held_back, failed = (0, 0) if found is None else (int(found[0]), int(found[1]))
        if held_back or failed:
            log.info(
                "streams published: %d messages no node could deliver offered again"
                " (%d backed off, %d failed)",
                held_back + failed,
                held_back,
                failed,
            )
            self.delivery.wake_here()

    async def _revive_again(self) -> None:
        """Once more, at the first heartbeat :data:`AGAIN_AFTER` seconds after a
        publish, for the streams still held: a peer's send to one of them that was
        under way when it was published (the peer claimed the message before the
        stream was in ``connections``) settles it as backed off just after the
        first offer."""
        async with self._lock:
            cutoff = asyncio.get_running_loop().time() - AGAIN_AFTER
            again = {pair for pair, at in self._again.items() if at <= cutoff}
            for pair in again:
                del self._again[pair]
            again &= self._published
            if again:
                await self._revive(await self._writer(), again)

    async def connected(self) -> None:
        """A worker connected: publish before its stream starts (never fatal to the
        connection — the heartbeat publishes later if this fails)."""
        try:
            await self.publish()
        except (psycopg.Error, OSError) as exc:
            log.warning("could not publish a new connection yet: %s", exc)

    # -- heartbeat and reaping ------------------------------------------------------

    async def _heartbeat(self) -> None:
        loop = asyncio.get_running_loop()
        last_reap = -math.inf  # not 0: loop.time() counts from boot, maybe just now
        while True:
            ok = False
            try:
                await self._beat()
                if self._again:
                    await self._revive_again()
                if self._dirty.is_set():
                    await self.publish()
                if loop.time() - last_reap >= self.heartbeat_every:
                    last_reap = loop.time()
                    reaped = await self.reap_dead()
                    if reaped:
                        self.delivery.wake_here()  # reconciliation resends what is due
                ok = True
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, OSError) as exc:
                log.warning("cluster heartbeat failed: %s", exc)
                async with self._lock:
                    await self._close_writer()
            except Exception:
                log.exception("cluster heartbeat failed")
            if ok:
                await wait_event(self._dirty, self.heartbeat_every)
            else:
                await asyncio.sleep(self.heartbeat_every)

    async def _beat(self) -> None:
        async with self._lock:
            conn = await self._writer()
            cur = await conn.execute(_Q["node_heartbeat"], (self.node,))
            if cur.rowcount == 0:
                # Peers took this node for dead and removed it (and its connections):
                # register again and republish everything.
                log.warning("node %s was presumed dead by a peer; re-registering", self.node)
                await conn.execute(_Q["node_register"], self._registration())
                self._published = set()
                self._dirty.set()

    async def reap_dead(self) -> int:
        """Move the claims of nodes whose heartbeat stopped to ``outcome_unknown`` and
        forget those nodes; returns how many claims were moved."""
        async with self._lock:
            conn = await self._writer()
            async with conn.transaction():
                cur = await conn.execute(_Q["nodes_dead"], (round(self.node_timeout * 1000),))
                dead = [r[0] for r in await cur.fetchall() if r[0] != self.node]
                if not dead:
                    return 0
                cur = await conn.execute(
                    _Q["claims_of_nodes_unknown"], (codes.NODE_DEAD, self.engine.clock(), dead)
                )
                reaped = max(cur.rowcount, 0)
                await conn.execute(_Q["groups_of_nodes_seen"], (dead,))
                await conn.execute(_Q["nodes_delete"], (dead,))
        log.warning("nodes %s stopped heartbeating; %d of their claims reaped", dead, reaped)
        self.reaped += reaped
        return reaped

    async def view(self) -> ClusterView:
        """Nodes, their connections and when each group was last seen, as the database
        has them (for the operator API: the whole cluster, not this node alone)."""
        async with self._lock:
            conn = await self._writer()
            nodes = await (await conn.execute(_Q["ops_nodes"])).fetchall()
            conns = await (await conn.execute(_Q["ops_connections"])).fetchall()
            groups = await (await conn.execute(_Q["ops_groups"])).fetchall()
        timeout = round(self.node_timeout * 1000)
        return ClusterView(
            nodes=[
                NodeInfo(
                    str(r[0]),
                    str(r[1]),
                    int(r[2]),
                    int(r[3]),
                    int(r[4]) - int(r[3]) <= timeout,
                    release=r[5],
                    schema=r[6],
                )
                for r in nodes
            ],
            connections=[
                WorkerInfo(str(r[1]), str(r[2]), str(r[0]), None if r[3] is None else int(r[3]))
                for r in conns
            ],
            last_seen={str(r[0]): int(r[1]) for r in groups},
            now=int(nodes[0][4]) if nodes else None,
        )

    async def horizon(self) -> Horizon:
        """What holds the database's xmin horizon back, and the dead tuples it left in
        the hot tables (``troth_postgres_horizon_*``, docs/operations.md)."""
        async with self._lock:
            conn = await self._writer()
            row = await (await conn.execute(_Q["ops_horizon"])).fetchone()
        assert row is not None
        age, xids, dead = row
        return Horizon(
            float(age),
            int(xids),
            {str(t): int(n) for t, n in (dead or {}).items()},
        )

    # -- LISTEN -----------------------------------------------------------------------

    async def _listen(self) -> None:
        while True:
            conn: AsyncConn | None = None
            try:
                conn = await self._connect(self.listen_url, "troth-listen")
                await conn.execute(f"LISTEN {CHANNEL}")
                self._listening.set()
                # Whatever was announced while not listening: look now.
                self.delivery.wake_here()
                self.engine.hint(0)
                async for note in conn.notifies():
                    self._heard(note.payload)
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, OSError) as exc:
                log.warning("cluster listener lost its connection (%s); reconnecting", exc)
            finally:
                if conn is not None:
                    await conn.close()
            await asyncio.sleep(1.0)

    def announce_unclaimed(self, messages: int) -> None:
        """Wake the other nodes for ``messages`` this node did not claim (writer
        thread, right after the commit that wrote them and this node's own claim)."""
        self.store.outbox.notify(f"{self.node} {messages} -")

    def announce_deadline(self, deadline: int) -> None:
        """Wake the other nodes' timers for a deadline earlier than any this node
        knew of (writer thread, right after the commit that armed it)."""
        self.store.outbox.notify(f"{self.node} 0 {deadline}")

    def _heard(self, payload: str) -> None:
        node, _, rest = payload.partition(" ")
        if node == self.node:
            return
        messages, _, deadline = rest.partition(" ")
        self.heard += 1
        if messages not in ("", "0"):
            self.delivery.wake_here()
        if deadline and deadline != "-":
            try:
                self.engine.hint(int(deadline))
                self.deadlines_heard += 1
            except ValueError:
                log.warning("ignoring malformed notification %r", payload)

    # -- connections --------------------------------------------------------------------

    async def _connect(self, url: str = "", role: str = "troth-cluster") -> AsyncConn:
        params = with_timeouts(conninfo_to_dict(url or self.store.url))  # timeouts.py
        params["application_name"] = f"{role}:{self.node}"[:63]
        conninfo = make_conninfo("", **params)
        conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        conn.prepare_threshold = None  # no server-side statement outlives its transaction
        return conn

    async def _writer(self) -> AsyncConn:
        """The connection for presence and heartbeats (callers hold ``_lock``)."""
        if self._write is None or self._write.closed or self._write.broken:
            await self._close_writer()
            self._write = await self._connect()
        return self._write

    async def _close_writer(self) -> None:
        if self._write is not None:
            try:
                await self._write.close()
            except (psycopg.Error, OSError):
                pass
            self._write = None
