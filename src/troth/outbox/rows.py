"""An outbox row, its states, and the one interface a store offers the dispatcher.

pending → dispatching (claimed, with a token) → completed | pending (backoff) | failed
| outcome_unknown; outcome_unknown → completed | failed | pending.  The message and
its key never change; only the lifecycle columns move.  The rules that move them are
written once, in ``store/outbox.py``; each store supplies only its table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from troth.protocol.records import Message, OutboxEntry


class RowState(StrEnum):
    """Where an outbox row is in its delivery lifecycle (stored as the string)."""

    PENDING = "pending"
    DISPATCHING = "dispatching"
    COMPLETED = "completed"
    FAILED = "failed"
    OUTCOME_UNKNOWN = "outcome_unknown"


@dataclass
class OutboxRow:
    """One outbox row; ``key`` is the message's idempotency key (seed 004)."""

    id: int
    entry: OutboxEntry
    created_at: int
    state: str = RowState.PENDING
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


@dataclass(frozen=True, slots=True)
class Settlement:
    """How one row ends a send (or a reconciliation).

    With a ``token``, the row must be ``dispatching`` under that claim token; without
    one (``None``), it must be ``outcome_unknown`` (reconciliation).  ``state`` is
    where it goes: ``completed``, ``failed``, ``outcome_unknown`` or ``pending``
    (back in the queue at ``available_at``, default ``now``).  A settlement the row
    no longer matches is refused and writes nothing.
    """

    row_id: int
    token: str | None
    state: RowState
    now: int
    code: str | None = None
    available_at: int | None = None


class OutboxLifecycle(Protocol):
    """The outbox rows of a store, as the dispatcher works them (``store.outbox``).

    Synchronous: the application decides on which thread each call runs (see
    :attr:`independent`).
    """

    #: Whether calls may run on any thread, concurrently with the store's request
    #: batches (a connection of its own); otherwise they run between batches.
    independent: bool

    def claim_due(self, worker_id: str, now: int, limit: int, token: str) -> list[OutboxRow]:
        """Move up to ``limit`` due pending rows, oldest ``(available_at, id)`` first, to
        ``dispatching`` under ``token`` (skip-locked: two callers never get one row)."""

    def settle(self, items: Sequence[Settlement]) -> list[bool]:
        """Several settlements, atomically, in order; one answer each."""

    def unknown_rows(self, limit: int) -> list[OutboxRow]: ...

    def release_expired_claims(
        self, cutoff: int, now: int, code: str, since: int | None = None
    ) -> int:
        """Rows claimed before ``cutoff`` (and, with ``since``, not before it) become
        ``outcome_unknown`` (the send may have happened); returns how many."""

    def purge_completed(self, before: int) -> int: ...

    def next_due(self) -> int | None:
        """The earliest ``available_at`` of a pending row."""

    def expedite(self, keys: Sequence[str]) -> int:
        """The pending rows of ``keys`` that were held back (due later than they were
        written) become due as written, i.e. at once (a worker connected: a task in
        backoff need not wait it out); how many.  Attempts stay as they were."""

    def revive(self, group: str, id: str, now: int, since: int) -> tuple[int, int]:
        """A worker connected to ``group/id`` on a node of its own: the rows no
        connection could take for that stream (backed off; failed since ``since``)
        are offered again; how many of each (``store/outbox.py``)."""

    def retry(self, rows: Sequence[tuple[int, str, str | None]], now: int) -> list[int]:
        """Failed rows ``(id, key, task id)`` pending again with fresh attempts, unless
        their message is no longer wanted (an operator's ``troth outbox retry``); the
        ids made pending."""
