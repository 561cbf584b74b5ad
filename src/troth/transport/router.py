"""Chooses the sender by the row's address scheme (``protocol.address.scheme_of``)."""

from __future__ import annotations

from collections.abc import Mapping

from troth.outbox import codes
from troth.outbox.rows import OutboxRow
from troth.outbox.types import Dispatched, OutboxSender, Permanent
from troth.protocol.address import scheme_of


class Router:
    """One sender per scheme (``poll`` → SSE, ``http``/``https`` → push); a row whose
    scheme has none can never be delivered (``Permanent``)."""

    def __init__(self, senders: Mapping[str, OutboxSender]) -> None:
        self.senders = dict(senders)

    async def send(self, row: OutboxRow) -> Dispatched:
        sender = self.senders.get(scheme_of(row.address))
        if sender is None:
            return Permanent(codes.BAD_ADDRESS)
        return await sender.send(row)
