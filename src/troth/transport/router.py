"""Chooses the sender by the row's address scheme."""

from __future__ import annotations

from troth.outbox import codes
from troth.outbox.rows import OutboxRow
from troth.outbox.types import Dispatched, OutboxSender, Permanent
from troth.protocol.address import HTTP, HTTPS, POLL, scheme_of


class Router:
    """``poll://`` → SSE, ``http(s)://`` → push; anything else can never be delivered."""

    def __init__(self, poll: OutboxSender, http: OutboxSender) -> None:
        self.poll = poll
        self.http = http

    async def send(self, row: OutboxRow) -> Dispatched:
        scheme = scheme_of(row.address)
        if scheme == POLL:
            return await self.poll.send(row)
        if scheme in (HTTP, HTTPS):
            return await self.http.send(row)
        return Permanent(codes.BAD_ADDRESS)
