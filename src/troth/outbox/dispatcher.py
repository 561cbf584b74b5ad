"""``OutboxDispatcher``: claims due rows, sends them, settles each one (seed 000).

It is not a background task.  Nothing here spawns anything that outlives a call:
``run_once`` does one sweep and returns what it did; the application owns the loop,
the wake-ups and the shutdown.  It dispatches exactly what a claim returned and hands
the sender the row's own idempotency key, never one it invents.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from troth.outbox import codes
from troth.outbox.types import (
    Completed,
    DispatchConfig,
    Dispatched,
    DispatchReport,
    Failed,
    OutboxReconciler,
    OutboxRows,
    OutboxSender,
    Permanent,
    ReconcileReport,
    Resend,
    Retryable,
    Unknown,
    Unresolved,
)
from troth.store.rows import OutboxRow

log = logging.getLogger("troth.outbox")


class OutboxDispatcher:
    """Claims due outbox rows, sends them and settles each one."""

    def __init__(
        self,
        rows: OutboxRows,
        sender: OutboxSender,
        config: DispatchConfig | None = None,
        reconciler: OutboxReconciler | None = None,
        *,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.rows = rows
        self.sender = sender
        self.config = config or DispatchConfig()
        self.reconciler = reconciler
        self.clock = clock or (lambda: time.time_ns() // 1_000_000)

    async def run_once(self, now: int) -> DispatchReport:
        """One sweep: claim a batch of due rows and settle every one of them."""
        rows = await self.rows.claim_due(self.config.worker_id, now, self.config.batch_size)
        return await self.dispatch(rows)

    async def dispatch(self, rows: Sequence[OutboxRow]) -> DispatchReport:
        """Send and settle rows this dispatcher already claimed (``claim_due`` under its
        worker id): for an application that claims elsewhere, e.g. right after the
        commit that wrote them."""
        report = DispatchReport(claimed=len(rows))
        if not rows:
            return report
        gate = asyncio.Semaphore(self.config.concurrency)

        async def one(row: OutboxRow) -> None:
            async with gate:
                outcome, seconds = await self._send(row)
                report.latencies.append(seconds)
                await self._settle(row, outcome, report)

        await asyncio.gather(*(one(r) for r in rows))
        return report

    async def _send(self, row: OutboxRow) -> tuple[Dispatched, float]:
        started = time.perf_counter()
        try:
            outcome = await asyncio.wait_for(self.sender.send(row), self.config.send_timeout)
        except TimeoutError:
            outcome = Unknown(codes.SEND_TIMEOUT)
        except Exception:
            # The sender broke mid-send: it may or may not have reached the remote.
            log.exception("sender failed on outbox row %s (%s)", row.id, row.key)
            outcome = Unknown(codes.SEND_CRASHED)
        return outcome, time.perf_counter() - started

    async def _settle(self, row: OutboxRow, outcome: Dispatched, report: DispatchReport) -> None:
        now = self.clock()
        if isinstance(outcome, Completed):
            ok = await self.rows.complete(row, now)
            report.completed += ok
        elif isinstance(outcome, Retryable):
            attempts = row.attempts + 1
            if attempts >= self.config.max_attempts:
                ok = await self.rows.fail(row, now, codes.ATTEMPTS_EXHAUSTED)
                report.failed += ok
            else:
                when = now + self.config.backoff_ms(attempts)
                ok = await self.rows.retry(row, now, when, outcome.code)
                report.retried += ok
        elif isinstance(outcome, Permanent):
            ok = await self.rows.fail(row, now, outcome.code)
            report.failed += ok
        else:
            ok = await self.rows.mark_unknown(row, now, outcome.code)
            report.unknown += ok
        if not ok:
            report.unsettled += 1
            log.warning("settlement of outbox row %s refused: claim lost", row.id)

    async def reconcile(self, now: int, limit: int = 100) -> ReconcileReport:
        """Settle rows whose outcome is unknown by asking the reconciler; never sends."""
        report = ReconcileReport()
        if self.reconciler is None:
            return report
        for row in await self.rows.unknown_rows(limit):
            report.examined += 1
            try:
                verdict = await self.reconciler.reconcile(row)
            except Exception:
                log.exception("reconciler failed on outbox row %s", row.id)
                verdict = Unresolved()
            if isinstance(verdict, Completed):
                report.completed += await self.rows.settle_unknown(row, now, "completed", None)
            elif isinstance(verdict, Failed):
                report.failed += await self.rows.settle_unknown(row, now, "failed", verdict.code)
            elif isinstance(verdict, Resend):
                report.resent += await self.rows.settle_unknown(row, now, "pending", None)
            else:
                report.unresolved += 1
        return report

    async def release_expired_claims(self, now: int) -> int:
        """Reap claims older than ``claim_timeout`` (a crashed dispatcher's rows)."""
        cutoff = now - int(self.config.claim_timeout * 1000)
        return await self.rows.release_expired_claims(cutoff, now)

    async def purge(self, now: int) -> int:
        """Delete completed rows older than the retention."""
        return await self.rows.purge_completed(now - int(self.config.retention * 1000))
