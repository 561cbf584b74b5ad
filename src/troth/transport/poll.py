"""SSE delivery: the registry of worker connections and the ``poll://`` sender.

A worker holds ``GET /poll/{group}/{id}`` open; each message is one ``data:`` line
followed by a blank line, LF only (the Python SDK sees nothing with CRLF).  Comment
lines keep the connection alive and are how a dead worker is noticed.  Several
connections may share one (group, id).

The sender answers ``Completed`` once the message was written to a live connection,
``Retryable`` when no connection can take it (it did not leave), and ``Unknown`` when
a write was under way when the connection broke.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from troth.asgi_types import Send
from troth.outbox import codes
from troth.outbox.rows import OutboxRow
from troth.outbox.types import Completed, Dispatched, Permanent, Retryable, Unknown
from troth.protocol.address import PollAddress, parse_poll
from troth.transport.messages import message_body

#: Groups whose last connection time this node remembers.
SEEN_GROUPS = 10_000
#: Messages waiting per connection before it counts as unable to take more.
QUEUE_SIZE = 1000


@dataclass
class Delivery:
    payload: bytes
    done: asyncio.Future[bool]


KEEPALIVE: Final = b": keepalive\n\n"


@dataclass(eq=False)
class Connection:
    """One open SSE stream, from the message offered to the frame written: the
    :class:`PollSender` offers a row's message (:meth:`offer`), and the stream's
    writer (:meth:`pump`, run by ``server/http/sse.py`` for the stream's request)
    writes it and answers the offer.

    The writer waits for the next message on one future that :meth:`offer`, the
    peer's disconnect and the node's shutdown resolve (:meth:`wake`), with one timer
    for the keep-alive: measured, a task per message plus ``asyncio.wait`` on three
    awaitables cost ~9 µs of the event loop per message more
    (docs/performance-notes.md, "The SSE writer")."""

    group: str
    id: str
    serial: int
    #: When it was opened (ms since the epoch).
    since: int = 0
    queue: deque[Delivery] = field(default_factory=deque)
    closed: bool = False
    #: What the writer waits on while nothing is queued (None: it is not waiting).
    waiter: asyncio.Future[None] | None = None

    def offer(self, payload: bytes) -> asyncio.Future[bool] | None:
        """Queue a message; None when the stream is closed or holds
        :data:`QUEUE_SIZE` messages already (it cannot take more)."""
        if self.closed or len(self.queue) >= QUEUE_SIZE:
            return None
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.queue.append(Delivery(payload, fut))
        self.wake()
        return fut

    def wake(self) -> None:
        """Rouse the writer: a message came, the peer left, or the node is closing."""
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next(self, timeout: float) -> Delivery | None:
        """The next queued message, waiting up to ``timeout`` seconds for one; None
        when none came (the keep-alive is due) or the writer was woken for another
        reason (:meth:`wake`); at once when the stream is closed."""
        if not self.queue and not self.closed:
            loop = asyncio.get_running_loop()
            waiter = self.waiter = loop.create_future()
            timer = loop.call_later(timeout, self.wake)
            try:
                await waiter
            finally:
                timer.cancel()
                self.waiter = None
        return self.queue.popleft() if self.queue else None

    async def pump(
        self, send: Send, keepalive: float, gone: asyncio.Future[None], closing: asyncio.Event
    ) -> None:
        """Write the next message, or a keep-alive when none came in ``keepalive``
        seconds, unless the peer is ``gone`` or the node is ``closing``.  The offer is
        answered True once its frame was written, False when it never left, and with
        the error when the write broke off (the sender cannot know what arrived)."""
        delivery = await self.next(keepalive)
        if delivery is None:
            if not gone.done() and not closing.is_set():
                await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
            return
        if gone.done():
            delivery.done.set_result(False)  # peer gone before the write: never left
            return
        try:
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + delivery.payload + b"\n\n",
                    "more_body": True,
                }
            )
        except BaseException as exc:
            delivery.done.set_exception(exc)
            raise
        delivery.done.set_result(True)

    def close(self) -> None:
        """Fail what is still queued: it never left, so it is retryable."""
        self.closed = True
        while self.queue:
            d = self.queue.popleft()
            if not d.done.done():
                d.done.set_result(False)
        self.wake()


class Full(Exception):
    """No room for another connection: on this node (``per_group`` False) or in its
    group; the message says which and how many are open."""

    def __init__(self, message: str, *, per_group: bool) -> None:
        super().__init__(message)
        self.per_group = per_group


class Registry:
    """Open connections by group and id, at most ``max_total`` on this node and
    ``max_per_group`` in one group (groups are case-insensitive)."""

    def __init__(
        self,
        on_change: Callable[[], None] | None = None,
        *,
        max_total: int | None = None,
        max_per_group: int | None = None,
        clock: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.groups: dict[str, dict[str, list[Connection]]] = {}
        self.clock = clock
        #: When each group last had a connection here (ms), kept after the last one
        #: closes: ``troth explain`` says "no worker connected since …".
        self.last_seen: dict[str, int] = {}
        self._serial = itertools.count(1)
        #: Anycast sends so far, by group: each group's rotation is its own, so one
        #: group's traffic does not skew how another's spreads over its workers.
        self._rr: dict[str, int] = {}
        self.on_change = on_change
        self.max_total = max_total
        self.max_per_group = max_per_group
        self._total = 0
        self._per_group: dict[str, int] = {}

    def connect(self, group: str, id: str) -> Connection:
        """Register a connection; raises :class:`Full` past a limit."""
        name = group.lower()
        if self.max_total is not None and self._total >= self.max_total:
            raise Full(
                f"this node holds {self._total} SSE connections (max_sse {self.max_total})",
                per_group=False,
            )
        in_group = self._per_group.get(name, 0)
        if self.max_per_group is not None and in_group >= self.max_per_group:
            raise Full(
                f"group {name[:64]!r} holds {in_group} SSE connections on this node"
                f" (max_sse_per_group {self.max_per_group})",
                per_group=True,
            )
        conn = Connection(name, id, next(self._serial), self.clock())
        self._seen(name)
        self.groups.setdefault(conn.group, {}).setdefault(id, []).append(conn)
        self._total += 1
        self._per_group[name] = in_group + 1
        if self.on_change is not None:
            self.on_change()
        return conn

    def disconnect(self, conn: Connection) -> None:
        conn.close()
        members = self.groups.get(conn.group, {})
        same = members.get(conn.id, [])
        if conn in same:
            same.remove(conn)
            self._seen(conn.group)
            self._total -= 1
            left = self._per_group[conn.group] - 1
            if left:
                self._per_group[conn.group] = left
            else:
                del self._per_group[conn.group]
        if not same:
            members.pop(conn.id, None)
        if not members:
            self.groups.pop(conn.group, None)
            self._rr.pop(conn.group, None)
        if self.on_change is not None:
            self.on_change()

    def _seen(self, group: str) -> None:
        """Note the group seen now, the latest last; forget the longest-unseen group
        past :data:`SEEN_GROUPS` (a client inventing group names cannot grow it)."""
        self.last_seen.pop(group, None)
        self.last_seen[group] = self.clock()
        if len(self.last_seen) > SEEN_GROUPS:
            del self.last_seen[next(iter(self.last_seen))]

    def count(self, group: str | None = None) -> int:
        """Open connections on this node, or in one group."""
        if group is None:
            return self._total
        return self._per_group.get(group.lower(), 0)

    def candidates(self, address: PollAddress) -> list[Connection]:
        """Connections in the order to try: the named id first, then (anycast) the rest
        of the group, rotated so load spreads."""
        members = self.groups.get(address.group, {})
        preferred = [c for c in members.get(address.id or "", []) if not c.closed]
        if address.cast == "uni":
            return preferred
        others = [c for id, cs in members.items() if id != address.id for c in cs if not c.closed]
        if others:
            turn = self._rr.get(address.group, 0)
            self._rr[address.group] = turn + 1
            k = turn % len(others)
            others = others[k:] + others[:k]
        return preferred + others


class PollSender:
    """Sends outbox rows with ``poll://`` addresses over the registry's connections."""

    def __init__(self, registry: Registry, server_url: str) -> None:
        self.registry = registry
        self.server_url = server_url

    async def send(self, row: OutboxRow) -> Dispatched:
        address = parse_poll(row.address)
        if address is None:
            return Permanent(codes.BAD_ADDRESS)
        payload = message_body(row.message, self.server_url)
        for conn in self.registry.candidates(address):
            fut = conn.offer(payload)
            if fut is None:
                continue
            try:
                written = await fut
            except Exception:
                return Unknown(codes.CONNECTION_LOST)
            if written:
                return Completed()
        return Retryable(codes.NO_CONNECTION)
