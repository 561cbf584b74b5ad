"""An outbox row with its delivery lifecycle.

pending → dispatching (claimed, with a token) → completed | pending (backoff) | failed
| outcome_unknown; outcome_unknown → completed | failed | pending.  The message and
its key never change; only the lifecycle columns move.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from troth.protocol.records import Message, OutboxEntry

PENDING: Final = "pending"
DISPATCHING: Final = "dispatching"
COMPLETED: Final = "completed"
FAILED: Final = "failed"
OUTCOME_UNKNOWN: Final = "outcome_unknown"
#: Code the store records on a requeued row that a newer pending row of its key
#: replaced (at most one pending row per key).
SUPERSEDED: Final = "troth.dispatch.superseded"
ROW_STATES: Final = frozenset({PENDING, DISPATCHING, COMPLETED, FAILED, OUTCOME_UNKNOWN})


#: One settlement: (row id, claim token, new state, now, code, available_at).
Settlement = tuple[int, str, str, int, str | None, int | None]


@dataclass
class OutboxRow:
    """One outbox row; ``key`` is the message's idempotency key (seed 004)."""

    id: int
    entry: OutboxEntry
    created_at: int
    state: str = PENDING
    attempts: int = 0
    available_at: int = 0
    claim_token: str | None = None
    claimed_by: str | None = None
    claimed_at: int | None = None
    last_code: str | None = None
    updated_at: int = 0

    @property
    def key(self) -> str:
        return self.entry.key

    @property
    def address(self) -> str:
        return self.entry.address

    @property
    def message(self) -> Message:
        return self.entry.message


class OutboxLifecycle(Protocol):
    """The synchronous row lifecycle a store offers (``store.outbox``)."""

    def claim_due(self, worker_id: str, now: int, limit: int, token: str) -> list[OutboxRow]: ...

    def settle_many(self, items: Sequence[Settlement]) -> list[bool]:
        """Several settlements, atomically; one answer each."""

    def unknown_rows(self, limit: int) -> list[OutboxRow]: ...

    def settle_unknown(self, row_id: int, now: int, state: str, code: str | None) -> bool: ...

    def release_expired_claims(self, cutoff: int, now: int, code: str) -> int: ...

    def purge_completed(self, before: int) -> int: ...

    def next_due(self) -> int | None: ...


def settle_one(
    life: OutboxLifecycle,
    row_id: int,
    token: str,
    state: str,
    now: int,
    code: str | None = None,
    available_at: int | None = None,
) -> bool:
    """One settlement through ``settle_many`` (each backend implements only that)."""
    return life.settle_many([(row_id, token, state, now, code, available_at)])[0]
