"""Why a store refuses writes: the faults a client can act on by waiting.

:class:`StoreUnavailable` is the store that cannot answer at all; a
:class:`StoreFault` is one of them with a reason.

A full disk, a database switched to read-only, a database out of reach: none of
them is the request's fault, none is a bug, and each ends by itself (space freed,
the primary back, the network healed).  A batch that meets one is refused whole,
with a :class:`StoreFault` naming the reason, so that the server answers 503 with
``Retry-After`` and a message that says what is wrong (docs/protocol.md), reports
itself not ready, and logs the episode once instead of a traceback per batch
(``engine/health.py``).

Each dialect says which of its errors are faults (``Store.refused``); the reasons
are the same words everywhere, and the label values of
``troth_store_write_errors_total``.
"""

from __future__ import annotations

from typing import Final, Literal

Reason = Literal["disk_full", "read_only", "unavailable"]

DISK_FULL: Final = "disk_full"
READ_ONLY: Final = "read_only"
UNAVAILABLE: Final = "unavailable"
REASONS: Final[tuple[Reason, ...]] = ("disk_full", "read_only", "unavailable")

#: What a client is told, by reason; the store's own words follow.  Out of reach,
#: a COMMIT may have broken off after it took effect: that message does not say
#: "not stored", and the store's words say when the outcome is unknown.
_TOLD: Final[dict[str, str]] = {
    DISK_FULL: "Storage is full: the request was not stored; retry later",
    READ_ONLY: "Storage is read-only: the request was not stored; retry later",
    UNAVAILABLE: "Store unavailable",
}


class StoreUnavailable(Exception):
    """The store cannot answer (503 at ``/ready`` and for a request)."""


class StoreFault(StoreUnavailable):
    """A write the store refused for a reason of its own (``reason``); nothing of the
    batch that met it was stored.  ``detail`` is the store's own message."""

    def __init__(self, reason: Reason, detail: str) -> None:
        self.reason: Reason = reason
        self.detail = detail.strip().splitlines()[0] if detail.strip() else ""
        told = _TOLD[reason]
        if reason == UNAVAILABLE:
            super().__init__(f"{told}: {self.detail}" if self.detail else told)
        else:
            super().__init__(f"{told} ({self.detail})" if self.detail else told)
