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
from collections.abc import Callable
from dataclasses import dataclass, field

from troth.outbox import codes
from troth.outbox.rows import OutboxRow
from troth.outbox.types import Completed, Dispatched, Permanent, Retryable, Unknown
from troth.protocol.address import PollAddress, parse_poll
from troth.transport.messages import message_body

#: Messages waiting per connection before it counts as unable to take more.
QUEUE_SIZE = 1000


@dataclass
class Delivery:
    payload: bytes
    done: asyncio.Future[bool]


@dataclass(eq=False)
class Connection:
    """One open SSE stream."""

    group: str
    id: str
    serial: int
    queue: asyncio.Queue[Delivery] = field(default_factory=lambda: asyncio.Queue(QUEUE_SIZE))
    closed: bool = False

    def offer(self, payload: bytes) -> asyncio.Future[bool] | None:
        if self.closed:
            return None
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        try:
            self.queue.put_nowait(Delivery(payload, fut))
        except asyncio.QueueFull:
            return None
        return fut

    def close(self) -> None:
        """Fail what is still queued: it never left, so it is retryable."""
        self.closed = True
        while not self.queue.empty():
            d = self.queue.get_nowait()
            if not d.done.done():
                d.done.set_result(False)


class Registry:
    """Open connections by group and id."""

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self.groups: dict[str, dict[str, list[Connection]]] = {}
        self._serial = itertools.count(1)
        self._rr = itertools.count()
        self.on_change = on_change

    def connect(self, group: str, id: str) -> Connection:
        conn = Connection(group.lower(), id, next(self._serial))
        self.groups.setdefault(conn.group, {}).setdefault(id, []).append(conn)
        if self.on_change is not None:
            self.on_change()
        return conn

    def disconnect(self, conn: Connection) -> None:
        conn.close()
        members = self.groups.get(conn.group, {})
        same = members.get(conn.id, [])
        if conn in same:
            same.remove(conn)
        if not same:
            members.pop(conn.id, None)
        if not members:
            self.groups.pop(conn.group, None)
        if self.on_change is not None:
            self.on_change()

    def count(self) -> int:
        return sum(len(c) for m in self.groups.values() for c in m.values())

    def candidates(self, address: PollAddress) -> list[Connection]:
        """Connections in the order to try: the named id first, then (anycast) the rest
        of the group, rotated so load spreads."""
        members = self.groups.get(address.group, {})
        preferred = [c for c in members.get(address.id or "", []) if not c.closed]
        if address.cast == "uni":
            return preferred
        others = [c for id, cs in members.items() if id != address.id for c in cs if not c.closed]
        if others:
            k = next(self._rr) % len(others)
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
