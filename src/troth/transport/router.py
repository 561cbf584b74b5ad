"""Chooses the sender by the row's address scheme."""

from __future__ import annotations

from troth.outbox import codes
from troth.outbox.types import Dispatched, OutboxSender, Permanent
from troth.store.rows import OutboxRow


class Router:
    """``poll://`` → SSE, ``http(s)://`` → push; anything else can never be delivered."""

    def __init__(self, poll: OutboxSender, http: OutboxSender) -> None:
        self.poll = poll
        self.http = http

    async def send(self, row: OutboxRow) -> Dispatched:
        address = row.address
        if address.startswith("poll://"):
            return await self.poll.send(row)
        if address.startswith(("http://", "https://")):
            return await self.http.send(row)
        return Permanent(codes.BAD_ADDRESS)
