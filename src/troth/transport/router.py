"""Chooses the sender by the row's address scheme (``protocol.address.scheme_of``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from troth.outbox import codes
from troth.outbox.rows import OutboxRow
from troth.outbox.types import Dispatched, OutboxSender, Permanent
from troth.protocol.address import NATS, scheme_of


class Router:
    """One sender per scheme (``poll`` → SSE, ``http``/``https`` → push, ``nats`` →
    NATS when configured); a row whose scheme has none can never be delivered by this
    node (``Permanent``), and ``undeliverable(address, code)`` is told, so that such a
    row is never failed in silence (the server logs and counts it)."""

    def __init__(
        self,
        senders: Mapping[str, OutboxSender],
        undeliverable: Callable[[str, str], None] | None = None,
    ) -> None:
        self.senders = dict(senders)
        self.undeliverable = undeliverable

    async def send(self, row: OutboxRow) -> Dispatched:
        scheme = scheme_of(row.address)
        sender = self.senders.get(scheme)
        if sender is None:
            code = codes.NATS_OFF if scheme == NATS else codes.BAD_ADDRESS
            if self.undeliverable is not None:
                self.undeliverable(row.address, code)
            return Permanent(code)
        return await sender.send(row)
