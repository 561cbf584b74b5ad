"""The store interface shared by every backend, and group commit on top of it.

A backend provides a :class:`Backend`: a transaction on which it can read, apply a
set of writes, and mark savepoints.  On top of that, :meth:`Store.execute` runs a
batch of jobs in *one* transaction, each job in its own :class:`Overlay`: a job
reads through its overlay (read-your-writes), and its writes reach the backend only
when the job returned.  A job that raises leaves nothing behind, and its neighbours
in the batch commit as if it had never run.  One commit per batch is what makes
``synchronous=FULL`` affordable (one fsync for many requests).

Correctness never rests on process-local state: every answer is read from the
backend inside the transaction, so several processes may share one database (the
PostgreSQL backend relies on this).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from troth.flow.limits import Limit
from troth.outbox.rows import OutboxLifecycle, OutboxRow
from troth.store.backend import Backend
from troth.store.deadlines import earliest_deadline
from troth.store.faults import StoreFault, StoreUnavailable
from troth.store.inspection import Inspection
from troth.store.overlay import Overlay, ReadOnly
from troth.store.retention import Retention
from troth.store.writes import Writes

T = TypeVar("T")

__all__ = [
    "Backend",
    "BatchClaim",
    "BeginWouldWait",
    "Job",
    "Outcome",
    "Overlay",
    "ReadOnly",
    "Store",
    "read_only",
]


@dataclass
class Job(Generic[T]):
    """One unit of work for :meth:`Store.execute`: ``fn(tx)`` at instant ``now``.

    ``keys`` are the promise (and task) ids ``fn`` will read first, when known in
    advance; a store shared with other writers locks them in sorted order before
    running the batch, so two batches over the same ids queue instead of
    deadlocking.  Stores without row locks ignore them.  ``settles`` are those of
    them whose promise ``fn`` may settle: that store then reads their awaiters up
    front too.
    """

    fn: Callable[[Overlay], T]
    now: int
    keys: tuple[str, ...] = ()
    settles: tuple[str, ...] = ()


@dataclass
class Outcome(Generic[T]):
    """What became of one job: its value, or the exception that discarded it; and, for
    a job that wrote, what its writes armed (the timer's and delivery's cue: the
    earliest deadline they set, how many outbox messages they wrote)."""

    value: T | None = None
    error: BaseException | None = None
    wrote: bool = False
    deadline: int | None = None
    messages: int = 0

    def result(self) -> T:
        """The job's value, or raise what it raised."""
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]

    @classmethod
    def of(cls, value: T, writes: Writes) -> Outcome[T]:
        """A job that returned ``value`` having made ``writes`` (kept by the commit)."""
        if not writes:
            return cls(value=value)
        return cls(
            value=value,
            wrote=True,
            deadline=earliest_deadline(writes),
            messages=len(writes.messages),
        )


class _ApplyFailed(Exception):
    """Internal: job ``index``'s writes failed half way (``Store.savepoints`` off)."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error


class BeginWouldWait(Exception):
    """Beginning a write transaction would wait for another writer (another process
    on the same SQLite file): the caller hands the batch to a thread that may wait.
    Internal to the engine; not PostgreSQL's ``StoreBusy`` (a batch that lost every
    attempt), which requests see."""


def read_only(
    backend: Backend, fn: Callable[[ReadOnly], T], store_errors: tuple[type[Exception], ...]
) -> Outcome[T]:
    """Run a read-only job ``fn`` over ``backend`` (a read snapshot): its value or its
    own exception; ``store_errors`` (the reader could not read) propagate, so the caller
    hands the whole batch to the writer.  A job that writes is a bug, and its outcome."""
    try:
        return Outcome(value=fn(ReadOnly(backend)))
    except store_errors:
        raise
    except Exception as exc:
        return Outcome(error=exc)


@dataclass(frozen=True, slots=True)
class BatchClaim:
    """A claim of due outbox rows made inside a batch's own transaction, just before
    its COMMIT (:meth:`Store.execute`'s ``claim_in_batch``): as the dispatcher's claim
    after a commit (``OutboxLifecycle.claim_due``), without a transaction and round
    trips of its own."""

    worker_id: str
    now: int
    limit: int
    token: str


class Store(ABC):
    """A backend that can run batches of jobs in one transaction."""

    name: str = "store"
    #: Whether other processes write the same data (PostgreSQL): a due deadline
    #: that this process could not fire was then most likely fired by another.
    shared: bool = False
    #: Whether jobs' ``keys`` are used (PostgreSQL locks and reads them up front):
    #: elsewhere the engine does not work them out (a suspend's or a create's inner
    #: actions would be decoded twice per request for nothing).
    uses_keys: bool = False
    #: The outbox-row lifecycle the dispatcher works through.
    outbox: OutboxLifecycle

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def flow_load(self) -> list[Limit]:
        """The limits as stored, read at start without a transaction of the writer's
        (a store with one writer overrides it; a store shared between nodes reads
        them through its writer once it runs, and again every second)."""
        return []

    # -- what a backend implements -------------------------------------------------

    @abstractmethod
    def begin(self) -> Backend:
        """Open a write transaction."""

    @abstractmethod
    def commit(self) -> None: ...

    @abstractmethod
    def rollback(self) -> None: ...

    @abstractmethod
    def savepoint(self) -> None: ...

    @abstractmethod
    def release(self) -> None: ...

    @abstractmethod
    def rollback_to(self) -> None: ...

    @abstractmethod
    def reset(self) -> None:
        """Delete every row (``debug.reset``)."""

    @abstractmethod
    def snapshot(self) -> dict[str, Any]:
        """Everything stored, for ``debug.snap``."""

    @abstractmethod
    def ping(self) -> None:
        """Raise :class:`StoreUnavailable` when the store cannot answer (``/ready``)."""

    #: Whether :meth:`read_inline` serves point reads (a SQLite file: a WAL reader).
    inline_reads: bool = False

    def read_inline(self, fn: Callable[[ReadOnly], T]) -> T:
        """Run a read-only job at once on the calling thread, on a reader connection
        of its own, in one read transaction; raise :class:`StoreUnavailable` if the
        reader cannot read right now (the caller then goes through the writer)."""
        raise NotImplementedError

    #: Whether :meth:`read_many` serves read-only requests off the writer (a SQLite
    #: file's WAL readers; PostgreSQL sessions that lock nothing).
    pooled_reads: bool = False
    #: How many threads call :meth:`read_many` (each with a connection of its own), or
    #: None for the engine's default.
    readers: int | None = None

    def read_many(self, jobs: Sequence[Job[Any]]) -> list[Outcome[Any]]:
        """Run read-only jobs on the calling thread (one of the engine's reader
        threads), on a connection of that thread's own, in one read snapshot that locks
        nothing and sees every commit made before it began; a job's exception is its
        outcome.  Raise :class:`StoreUnavailable` when the store cannot read right now
        (the caller then has the writer answer them)."""
        raise NotImplementedError

    @abstractmethod
    def inspect(self, fn: Callable[[Inspection], T]) -> T:
        """Run ``fn`` over one read-only, lock-free snapshot (store/inspection.py):
        for operators, off the writer where the backend allows; blocking, so callers
        on the event loop run it in a thread."""

    @abstractmethod
    def retain(self, fn: Callable[[Retention], T]) -> T:
        """Run ``fn`` in one write transaction of its own (store/retention.py): on the
        writer's connection where there is one writer (callers run it between
        batches), on a session of its own on PostgreSQL (row locks, skip-locked)."""

    def retain_open(self, fn: Callable[[Retention], T]) -> T:
        """Run ``fn`` in the write transaction the caller holds open (a request batch's,
        under a savepoint: ``Engine.exclusive``'s ``inside``), committed with it; only
        a store with :attr:`loop_batches` is asked."""
        raise NotImplementedError

    def refused(self, exc: BaseException) -> StoreFault | None:
        """``exc`` as a :class:`~troth.store.faults.StoreFault` when it says the store
        refuses writes for a reason of its own (full, read-only, out of reach), else
        None (a request's own error, or a bug).  A dialect adds its database's errors;
        a :class:`StoreUnavailable` is the store out of reach."""
        if isinstance(exc, StoreFault):
            return exc
        if isinstance(exc, StoreUnavailable):
            return StoreFault("unavailable", str(exc))
        return None

    def probe(self) -> None:  # noqa: B027 - optional hook
        """Commit a write that changes nothing (``/ready``, and while writes fail: has
        the fault ended?); raise what the store raised.  A store without a disk or a
        server to lose commits nothing."""

    def recovered(self) -> None:  # noqa: B027 - optional hook
        """Writes succeed again after a fault (on the writer, between batches): a
        SQLite file gives back the WAL that grew while its disk was full."""

    def reclaim(self, pages: int, spare: float = 0.0) -> int:
        """Give up to ``pages`` free pages back to the file system, keeping ``spare`` of
        the file's pages free for the rows to come; the free pages left beyond those
        (0: nothing more to give).  Only a SQLite file has pages to give back
        (retention calls it after a pass)."""
        return 0

    def reclaim_open(self, pages: int, spare: float = 0.0) -> int:
        """:meth:`reclaim` in the write transaction the caller holds open (as
        :meth:`retain_open`)."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""

    def take_claimed(self) -> list[OutboxRow] | None:
        """The rows the last committed batch claimed (:meth:`execute`'s
        ``claim_in_batch``), taken once, in claim order; None when it claimed nothing
        itself (the delivery then claims after the commit)."""
        return None

    # -- group commit ----------------------------------------------------------------

    #: How a job whose writes fail half way is undone: by a savepoint around each
    #: job's writes, or (False) by rolling the whole batch back and running it again
    #: without that job.  Re-running costs a batch once per such failure (a bug or
    #: a full disk: rare); a savepoint costs two statements for every job of every
    #: batch (SQLite: ~15 % of the writer, docs/performance-notes.md).
    savepoints: bool = True

    #: Whether the engine may run batches on the event loop's thread and only their
    #: COMMIT on the writer thread (:meth:`run_open`).  A SQLite batch is Python and
    #: in-process SQL, on the GIL whichever thread runs it; run on the writer thread
    #: it hands the GIL back and forth with the event loop at every statement (SQLite
    #: lets go of it for each step), which cost a fifth of the server's CPU in
    #: context switches (docs/performance-notes.md).  Only the fsync in COMMIT waits.
    loop_batches: bool = False

    def execute(
        self,
        jobs: Sequence[Job[Any]],
        claim_in_batch: Callable[[], BatchClaim | None] | None = None,
    ) -> list[Outcome[Any]]:
        """Run every job in its own overlay, in order, in one transaction; commit once.

        A job that raises is discarded alone.  If the commit itself fails, every job
        of the batch gets that error (nothing of the batch was acknowledged).

        ``claim_in_batch`` (the engine's, from the delivery) is asked, on the calling
        thread, by a batch that wrote outbox messages what to claim before its COMMIT
        (None: claim nothing now).  Only a store that overrides :meth:`take_claimed`
        (PostgreSQL) asks; given per call, it costs the batch an argument, and a store
        holds no hook that someone must remember to set.
        """
        with self.lock:
            try:
                outcomes = self.run_open(jobs)
                self.commit()
            except Exception as exc:
                try:
                    self.rollback()
                finally:
                    failed_all = [Outcome[Any](error=exc) for _ in jobs]
                return failed_all
            return outcomes

    def run_open(self, jobs: Sequence[Job[Any]], *, nowait: bool = False) -> list[Outcome[Any]]:
        """The batch of :meth:`execute` up to its commit: its transaction is left open
        for the caller (holding :attr:`lock`) to commit or roll back.  With ``nowait``
        it raises :class:`BeginWouldWait` at once, having begun nothing, where beginning
        would wait for another writer."""
        aside: dict[int, BaseException] = {}
        while True:
            try:
                return self._batch(jobs, aside, nowait)
            except _ApplyFailed as failed:
                # Its writes went in half way: start over without it (its jobs are
                # pure functions of the store, so a re-run is the same run) — unless
                # the store refuses writes (a full disk): then it refuses them all.
                self.rollback()
                fault = self.refused(failed.error)
                if fault is not None:
                    raise fault from failed.error
                aside[failed.index] = failed.error

    def begin_nowait(self) -> Backend:
        """:meth:`begin`, raising :class:`BeginWouldWait` where it would wait."""
        return self.begin()

    def _batch(
        self, jobs: Sequence[Job[Any]], aside: dict[int, BaseException], nowait: bool = False
    ) -> list[Outcome[Any]]:
        outcomes: list[Outcome[Any]] = []
        backend = self.begin_nowait() if nowait else self.begin()
        for i, job in enumerate(jobs):
            if i in aside:
                outcomes.append(Outcome(error=aside[i]))
                continue
            overlay = Overlay(backend)
            try:
                value = job.fn(overlay)
            except Exception as exc:
                outcomes.append(Outcome(error=exc))
                continue
            if overlay.writes:
                if not self.savepoints:
                    try:
                        backend.apply(overlay.writes, job.now)
                    except Exception as exc:
                        raise _ApplyFailed(i, exc) from exc
                else:
                    self.savepoint()
                    try:
                        backend.apply(overlay.writes, job.now)
                    except Exception as exc:
                        self.rollback_to()
                        outcomes.append(Outcome(error=exc))
                        continue
                    self.release()
            outcomes.append(Outcome.of(value, overlay.writes))
        return outcomes

    #: Whether :meth:`next_deadline` reads on a session of its own (PostgreSQL), so
    #: the timer calls it from a thread of its own rather than between the writer's
    #: batches: while a snapshot holds the horizon back, the read walks dead index
    #: entries, and on the writer it would stall every request that long.
    deadline_apart: bool = False

    def next_deadline(self, within: tuple[int, int] | None = None) -> int | None:
        """The earliest instant the timer has to act at (0: undrained promises wait),
        or None when nothing is armed; through the writer unless
        :attr:`deadline_apart`.  A store apart may take ``within`` = ``(low, high)``
        and look only at deadlines in that range (the earliest there, or None); one
        that reads them all may ignore it."""
        return self.read(lambda tx: tx.next_deadline())

    def read(self, fn: Callable[[Overlay], T]) -> T:
        """Run one job for its answer (the timer's ``next_deadline``); meant for jobs
        that write nothing."""
        outcome: Outcome[T] = self.execute([Job(fn, 0)])[0]
        return outcome.result()
