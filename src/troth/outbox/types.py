"""The dispatcher's vocabulary: configuration, outcomes, reports, and the interfaces
it works through (seed 000).

The safety contract lives in :class:`Dispatched`: a send that may have reached the
remote is ``Unknown``, never a retry, because repeating it is the duplicate the
library exists to prevent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from troth.outbox.rows import OutboxRow


@dataclass(frozen=True)
class DispatchConfig:
    """How the dispatcher works; every field optional, every default conservative."""

    worker_id: str = "troth"
    batch_size: int = 100
    send_timeout: float = 30.0  # seconds; past it a send is Unknown
    backoff_initial: float = 1.0  # seconds before the first retry
    backoff_factor: float = 4.0
    backoff_max: float = 60.0
    max_attempts: int = 5
    concurrency: int = 64  # sends in flight at once within one sweep
    claim_timeout: float = 120.0  # seconds; older claims are reaped (must exceed send_timeout)
    retention: float = 3600.0  # seconds completed rows are kept before purge
    unblock_resends: int = 3  # how often an unknown unblock is re-sent

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.concurrency < 1 or self.max_attempts < 1:
            raise ValueError("batch_size, concurrency and max_attempts must be >= 1")
        if self.send_timeout <= 0 or self.backoff_initial < 0 or self.backoff_factor < 1:
            raise ValueError("send_timeout > 0, backoff_initial >= 0, backoff_factor >= 1")
        if self.claim_timeout <= self.send_timeout:
            raise ValueError("claim_timeout must exceed send_timeout")

    def backoff_ms(self, attempts: int) -> int:
        """Delay before attempt ``attempts + 1``: initial × factor^(attempts-1), capped."""
        delay = self.backoff_initial * self.backoff_factor ** max(attempts - 1, 0)
        return int(min(delay, self.backoff_max) * 1000)


# ---------------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class Completed:
    """The remote confirmed."""


@dataclass(frozen=True)
class Retryable:
    """The request demonstrably did not arrive; try again after a backoff."""

    code: str


@dataclass(frozen=True)
class Permanent:
    """The remote refused and will refuse again."""

    code: str


@dataclass(frozen=True)
class Unknown:
    """The request left; nobody can say it did not land."""

    code: str = "troth.dispatch.unknown"


Dispatched = Completed | Retryable | Permanent | Unknown


@dataclass(frozen=True)
class Failed:
    """Reconciliation found the effect will never happen."""

    code: str


@dataclass(frozen=True)
class Resend:
    """Reconciliation is certain the message never took effect: queue it again."""


@dataclass(frozen=True)
class Unresolved:
    """Reconciliation could not tell yet; ask again on the next sweep."""


Reconciled = Completed | Failed | Resend | Unresolved


# ---------------------------------------------------------------------- interfaces


class OutboxSender(Protocol):
    """Calls the outside world for one row and classifies the outcome itself."""

    async def send(self, row: OutboxRow) -> Dispatched: ...


class OutboxReconciler(Protocol):
    """Asks what happened to a row whose outcome is unknown."""

    async def reconcile(self, row: OutboxRow) -> Reconciled: ...


# ------------------------------------------------------------------------ reports


@dataclass
class DispatchReport:
    """What one sweep did."""

    claimed: int = 0
    completed: int = 0
    retried: int = 0
    failed: int = 0
    unknown: int = 0
    unsettled: int = 0  # settlements the store refused (claim lost)
    latencies: list[float] = field(default_factory=list)  # seconds per send


@dataclass
class ReconcileReport:
    """What one reconciliation sweep did."""

    examined: int = 0
    completed: int = 0
    failed: int = 0
    resent: int = 0
    unresolved: int = 0
