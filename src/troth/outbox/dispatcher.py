"""``OutboxDispatcher``: claims due rows, sends them, settles each one (seed 000).

It is not a background task.  Nothing here spawns anything that outlives a call:
``run_once`` does one sweep and returns what it did; the application owns the loop,
the wake-ups and the shutdown.  It dispatches exactly what a claim returned and hands
the sender the row's own idempotency key, never one it invents.

It works a store's rows through one interface, ``outbox.rows.OutboxLifecycle``,
which is synchronous: the application passes ``run``, which says where a blocking
lifecycle call runs (a thread of its own, or between the writer's batches).
Settlements that finish while an earlier one is being written are written together,
in one transaction (group commit for the dispatcher's own writes).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from troth.outbox import codes
from troth.outbox.rows import OutboxLifecycle, OutboxRow, RowState, Settlement
from troth.outbox.types import (
    Completed,
    DispatchConfig,
    Dispatched,
    DispatchReport,
    Failed,
    OutboxReconciler,
    OutboxSender,
    Permanent,
    ReconcileReport,
    Resend,
    Retryable,
    Unknown,
    Unresolved,
)

log = logging.getLogger("troth.outbox")
T = TypeVar("T")

#: Milliseconds below the last pass's cutoff that the reaper's next pass reads from:
#: room for a claim stamped by a node whose clock runs that much behind this one's.
REAP_OVERLAP = 5_000
#: Seconds between the reaper's passes that read every claim from the bottom.
FULL_REAP_EVERY = 300.0


class Runner(Protocol):
    """Runs one blocking lifecycle call and awaits its result."""

    async def __call__(self, fn: Callable[[], T], /) -> T: ...


async def in_thread(fn: Callable[[], T]) -> T:
    """The default :class:`Runner`: a worker thread."""
    return await asyncio.to_thread(fn)


class Settler:
    """Writes settlements; those that meet while one write is under way go together."""

    def __init__(self, life: OutboxLifecycle, run: Runner) -> None:
        self.life = life
        self.run = run
        self._queued: list[tuple[Settlement, asyncio.Future[bool]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def settle(self, settlement: Settlement) -> bool:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queued.append((settlement, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        while self._queued:
            batch, self._queued = self._queued, []
            items = [item for item, _ in batch]
            try:
                results = await self.run(functools.partial(self.life.settle, items))
            except Exception as exc:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut), ok in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(ok)


def new_token() -> str:
    """A claim's token: what a settlement must show to move the rows it claimed."""
    return uuid.uuid4().hex


class OutboxDispatcher:
    """Claims due outbox rows, sends them and settles each one."""

    def __init__(
        self,
        life: OutboxLifecycle,
        sender: OutboxSender,
        config: DispatchConfig | None = None,
        reconciler: OutboxReconciler | None = None,
        *,
        clock: Callable[[], int] | None = None,
        run: Runner = in_thread,
    ) -> None:
        self.life = life
        self.sender = sender
        self.config = config or DispatchConfig()
        self.reconciler = reconciler
        self.clock = clock or (lambda: time.time_ns() // 1_000_000)
        self.run = run
        self.settler = Settler(life, run)
        #: The cutoff of the reaper's last pass, and when (monotonic) it last read from
        #: the bottom: a pass in between reads only the claims taken since that cutoff
        #: (:meth:`release_expired_claims`).
        self._reaped_to: int | None = None
        self._full_reap = -math.inf

    async def run_once(self, now: int) -> DispatchReport:
        """One sweep: claim a batch of due rows and settle every one of them."""
        rows = await self.run(lambda: self.claim(now))
        return await self.dispatch(rows)

    def claim(self, now: int) -> list[OutboxRow]:
        """Claim a batch of due rows under a new token (blocking: the caller chooses the
        thread, e.g. right after the commit that wrote them)."""
        token = new_token()
        return self.life.claim_due(self.config.worker_id, now, self.config.batch_size, token)

    async def next_due(self) -> int | None:
        """When the earliest pending row becomes due (None: none is pending)."""
        return await self.run(self.life.next_due)

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
            # In this task, not in one of its own as wait_for on Python 3.11 would
            # start (a loop iteration more before the row leaves).
            async with asyncio.timeout(self.config.send_timeout):
                outcome = await self.sender.send(row)
        except TimeoutError:
            outcome = Unknown(codes.SEND_TIMEOUT)
        except Exception:
            # The sender broke mid-send: it may or may not have reached the remote.
            log.exception("sender failed on outbox row %s (%s)", row.id, row.key)
            outcome = Unknown(codes.SEND_CRASHED)
        return outcome, time.perf_counter() - started

    async def _settle(self, row: OutboxRow, outcome: Dispatched, report: DispatchReport) -> None:
        now = self.clock()
        token = row.claim_token or ""
        if isinstance(outcome, Completed):
            ok = await self.settler.settle(Settlement(row.id, token, RowState.COMPLETED, now))
            report.completed += ok
        elif isinstance(outcome, Retryable):
            # The store counts the attempt as it settles; this is the count it will hold.
            attempts = row.attempts + 1
            if attempts >= self.config.max_attempts:
                failed = Settlement(row.id, token, RowState.FAILED, now, codes.ATTEMPTS_EXHAUSTED)
                ok = await self.settler.settle(failed)
                report.failed += ok
            else:
                when = now + self.config.backoff_ms(attempts)
                again = Settlement(row.id, token, RowState.PENDING, now, outcome.code, when)
                ok = await self.settler.settle(again)
                report.retried += ok
        elif isinstance(outcome, Permanent):
            failed = Settlement(row.id, token, RowState.FAILED, now, outcome.code)
            ok = await self.settler.settle(failed)
            report.failed += ok
        else:
            unknown = Settlement(row.id, token, RowState.OUTCOME_UNKNOWN, now, outcome.code)
            ok = await self.settler.settle(unknown)
            report.unknown += ok
        if not ok:
            report.unsettled += 1
            log.warning("settlement of outbox row %s refused: claim lost", row.id)

    async def reconcile(self, now: int, limit: int = 100) -> ReconcileReport:
        """Settle rows whose outcome is unknown by asking the reconciler; never sends."""
        report = ReconcileReport()
        if self.reconciler is None:
            return report
        for row in await self.run(lambda: self.life.unknown_rows(limit)):
            report.examined += 1
            try:
                verdict = await self.reconciler.reconcile(row)
            except Exception:
                log.exception("reconciler failed on outbox row %s", row.id)
                verdict = Unresolved()
            if isinstance(verdict, Completed):
                done = Settlement(row.id, None, RowState.COMPLETED, now)
                report.completed += await self.settler.settle(done)
            elif isinstance(verdict, Failed):
                failed = Settlement(row.id, None, RowState.FAILED, now, verdict.code)
                report.failed += await self.settler.settle(failed)
            elif isinstance(verdict, Resend):
                again = Settlement(row.id, None, RowState.PENDING, now)
                report.resent += await self.settler.settle(again)
            else:
                report.unresolved += 1
        return report

    async def release_expired_claims(self, now: int) -> int:
        """Reap claims older than ``claim_timeout`` (a crashed dispatcher's rows): their
        outcome is unknown, for reconciliation.

        A pass reads the claims taken since the last pass's cutoff, less
        :data:`REAP_OVERLAP` (a claim stamped by a node whose clock runs behind), not
        every claim before its own cutoff: while a snapshot holds PostgreSQL's horizon
        back, each claim settled since leaves a dead entry below the cutoff, and a walk
        from the bottom would pass them all, every pass.  Every :data:`FULL_REAP_EVERY`
        seconds, at the first pass and after the wall clock steps back, a pass reads
        from the bottom: a claim stamped further behind waits at most that long."""
        cutoff = now - int(self.config.claim_timeout * 1000)
        since: int | None = None
        moment = time.monotonic()
        last = self._reaped_to
        if last is not None and last <= cutoff and moment - self._full_reap < FULL_REAP_EVERY:
            since = last - REAP_OVERLAP
        else:
            self._full_reap = moment
        code = codes.CLAIM_EXPIRED
        reaped = await self.run(lambda: self.life.release_expired_claims(cutoff, now, code, since))
        self._reaped_to = cutoff
        return reaped

    async def purge(self, now: int) -> int:
        """Delete completed rows older than the retention."""
        before = now - int(self.config.retention * 1000)
        return await self.run(lambda: self.life.purge_completed(before))
