"""``GET /poll/{group}/{id}``: the SSE stream a worker holds open for its messages.

One ``data:`` line per message, LF framing, comment keep-alives (which also reveal
a dead peer).  A stream that opens is news for delivery: its address is routed here
(a cluster publishes it), what could not be delivered to it while it was away is
offered again, and its group's tasks held back by the bounce backoff go now.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec

from troth.asgi_types import Receive, Send
from troth.plural import counted
from troth.server.delivery.bounces import BounceTracker
from troth.server.delivery.cluster import Cluster
from troth.server.delivery.loop import DeliveryLoop
from troth.server.http.asgi import send_bytes
from troth.server.logs import Throttled
from troth.store.outbox import REVIVE_WINDOW
from troth.transport.poll import Full, Registry

log = logging.getLogger("troth.server")
_json = msgspec.json.Encoder()


class PollStreams:
    """Opens, runs and ends the SSE streams of one node's workers; each stream, from
    the message offered to the frame written, is a
    :class:`~troth.transport.poll.Connection`."""

    def __init__(
        self,
        registry: Registry,
        keepalive: float,
        closing: asyncio.Event,
        bounces: BounceTracker,
        clock: Callable[[], int],
        delivery: DeliveryLoop | None,
        cluster: Cluster | None,
    ) -> None:
        self.registry = registry
        self.keepalive = keepalive
        #: Set when the node shuts down: every stream ends.
        self.closing = closing
        self.bounces = bounces
        self.clock = clock
        self.delivery = delivery
        self.cluster = cluster
        self.refusals = Throttled(log)

    async def poll(self, receive: Receive, send: Send, group: str, id: str) -> None:
        """Hold an SSE stream open for a worker until it leaves or the node closes."""
        try:
            conn = self.registry.connect(group, id)
        except Full as exc:
            status = 429 if exc.per_group else 503
            self.refusals.warning(
                "sse-group" if exc.per_group else "sse-node",
                "refused SSE connection for %s/%s: %s",
                group[:64],
                id[:64],
                exc,
            )
            await send_bytes(
                send,
                status,
                _json.encode({"error": f"Too many SSE connections: {exc}"}),
                [(b"retry-after", b"%d" % max(1, round(self.keepalive)))],
            )
            return
        if self.cluster is not None:
            await self.cluster.connected()  # peers route this address here from now on
        else:
            await self.revive(group, id)
        await self.expedite(group)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        gone = asyncio.Event()

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    gone.set()
                    return

        # The peer leaving and the node closing rouse the writer (Connection.wake)
        # from its one wait; nothing is created per message.
        watcher = asyncio.create_task(watch())
        watcher.add_done_callback(lambda _: conn.wake())
        closing = asyncio.create_task(self.closing.wait())
        closing.add_done_callback(lambda _: conn.wake())
        if self.delivery is not None:
            self.delivery.wake_here()  # rows waiting for this address can go now
        try:
            await send(
                {"type": "http.response.body", "body": b": connected\n\n", "more_body": True}
            )
            while not gone.is_set() and not self.closing.is_set():
                await conn.pump(send, self.keepalive, watcher, self.closing)
        finally:
            self.registry.disconnect(conn)
            watcher.cancel()
            closing.cancel()
        if not gone.is_set():
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def revive(self, group: str, id: str) -> None:
        """A worker connected to a node of its own (SQLite, memory): what could not be
        delivered to its stream while it was away is offered again (``OutboxStore.
        revive``; a cluster does the same when a node publishes a stream).  The
        dispatcher is woken once the stream is set up (:meth:`poll`)."""
        if self.delivery is None:
            return
        group = group.lower()  # as the registry and poll:// addresses have it
        life = self.delivery.calls.life
        now = self.clock()
        since = now - round(REVIVE_WINDOW * 1000)
        try:
            held, failed = await self.delivery.calls(lambda: life.revive(group, id, now, since))
        except Exception as exc:  # a courtesy: the retry timer re-emits what matters
            log.warning("could not offer again the messages for %s/%s: %s", group, id, exc)
            return
        if held or failed:
            log.info(
                "worker connected to %s/%s: %d messages that could not be delivered offered"
                " again (%d backed off, %d failed)",
                group[:64],
                id[:64],
                held + failed,
                held,
                failed,
            )

    async def expedite(self, group: str) -> None:
        """A worker of ``group`` connected: the tasks of that group held back by the
        bounce backoff are offered now (it may have the function the others lack)."""
        keys = self.bounces.expedite(group)
        if not keys or self.delivery is None:
            return
        life = self.delivery.calls.life
        try:
            n = await self.delivery.calls(lambda: life.expedite(keys))
        except Exception as exc:  # a courtesy: the rows come due by themselves anyway
            tasks = counted(len(keys), "task")
            log.warning("could not expedite %s of group %s: %s", tasks, group, exc)
            return
        if n:
            log.info("worker of group %s connected: %d backed-off tasks offered now", group, n)
