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
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from troth.flow.limits import Held, Limit, held_order, key_of
from troth.outbox.rows import OutboxLifecycle, OutboxRow
from troth.protocol.records import (
    TAG_BRANCH,
    Message,
    OutboxEntry,
    Promise,
    Schedule,
    Tags,
    Task,
    message_key,
)
from troth.store.deadlines import earliest_deadline
from troth.store.faults import StoreFault, StoreUnavailable
from troth.store.inspection import Inspection
from troth.store.retention import Retention
from troth.store.writes import Writes

T = TypeVar("T")


class Backend(ABC):
    """One open transaction of a backend: reads, scans, and applying writes."""

    @abstractmethod
    def get_promise(self, id: str) -> Promise | None: ...

    @abstractmethod
    def get_task(self, id: str) -> Task | None: ...

    @abstractmethod
    def get_schedule(self, id: str) -> Schedule | None: ...

    @abstractmethod
    def scan_promises(
        self, states: Collection[str] | None, tags: Tags, after: str | None, limit: int
    ) -> list[Promise]: ...

    @abstractmethod
    def scan_tasks(
        self, states: Collection[str] | None, after: str | None, limit: int
    ) -> list[Task]: ...

    @abstractmethod
    def scan_schedules(self, tags: Tags, after: str | None, limit: int) -> list[Schedule]: ...

    @abstractmethod
    def promises_in_branch(self, branch: str, limit: int) -> list[Promise]: ...

    @abstractmethod
    def due_promises(self, now: int, limit: int) -> list[str]: ...

    @abstractmethod
    def due_tasks(self, now: int, limit: int) -> list[str]: ...

    @abstractmethod
    def due_schedules(self, now: int, limit: int) -> list[str]: ...

    @abstractmethod
    def undrained_promises(self, limit: int) -> list[str]: ...

    @abstractmethod
    def next_deadline(self) -> int | None: ...

    @abstractmethod
    def apply(self, writes: Writes, now: int) -> None:
        """Write one job's effects; outbox entries are keyed upserts of *pending* rows."""

    def get_trace(self, id: str) -> str | None:
        """The trace context promise ``id`` was created in (``Writes.traces``), or
        None: tracing was off then, or there is no such promise.  Asked only with
        tracing on (``server/tracing.py``); a store that keeps none has none."""
        return None

    # -- flow control (troth/flow): read only while some group has a limit ----------

    def flow_limits(self) -> list[Limit]:
        """Every limit, by group."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_slot(self, task_id: str) -> str | None:
        """The group whose slot the task holds, or None."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_in_use(self, group: str) -> int:
        """How many tasks hold a slot of ``group``."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_tat(self, group: str) -> float:
        """The token bucket of the group's rate limit (``Writes.tats``; 0: full)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_lock(self, group: str) -> None:
        """Take the group's turn: until this transaction ends, no other counts or
        admits for ``group`` (a store shared between nodes locks its limit row; a
        store with one writer has nothing to do)."""
        return None

    def flow_slots_of(self, group: str) -> list[str]:
        """The tasks that hold a slot of ``group``, by id."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_held(self, group: str, limit: int, offset: int = 0) -> list[Held]:
        """``limit`` tasks queued for a slot of ``group``, in queue order (higher
        priority first, then turn, then first created, then by id), after the first
        ``offset``."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_queued(self, task_id: str) -> Held | None:
        """The task's place in its group's queue, or None: it is not queued."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_key_in_use(self, group: str, key: str) -> int:
        """How many tasks of ``key`` hold a slot of ``group``."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_key_turn(self, group: str, key: str) -> int:
        """The last turn of the tasks of ``key`` queued in ``group`` (0: none)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_turn(self, group: str) -> int:
        """The turn of the last task of ``group`` let through (0: none yet)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_place(self, task_id: str, group: str, key: str) -> tuple[Held | None, int]:
        """Where a task stands in its group's queue (None: not queued), and the last
        turn a new task of ``key`` queues behind: the group's, or its key's last
        queued one, whichever is later.  One read where a store can (PostgreSQL)."""
        turn = max(self.flow_turn(group), self.flow_key_turn(group, key))
        return self.flow_queued(task_id), turn

    def flow_held_count(self, group: str) -> int:
        """How many tasks are queued for a slot of ``group``."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")


class Overlay:
    """A job's private view: its own writes over the shared transaction.

    Implements the machine's ``Tx``.  Searches and the deadline index read the backend
    only (they see earlier jobs of the batch, not this job's own writes); no handler
    searches after writing something the search could return.  ``preload`` merges the
    job's own writes into the branch it reads.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.writes = Writes()

    def get_promise(self, id: str) -> Promise | None:
        p = self.writes.promises.get(id)
        return p if p is not None else self.backend.get_promise(id)

    def get_task(self, id: str) -> Task | None:
        t = self.writes.tasks.get(id)
        return t if t is not None else self.backend.get_task(id)

    def get_schedule(self, id: str) -> Schedule | None:
        if id in self.writes.schedules:
            return self.writes.schedules[id]
        return self.backend.get_schedule(id)

    def set_promise(self, promise: Promise) -> None:
        self.writes.promises[promise.id] = promise

    def set_task(self, task: Task) -> None:
        self.writes.tasks[task.id] = task

    def set_schedule(self, schedule: Schedule) -> None:
        self.writes.schedules[schedule.id] = schedule

    def del_schedule(self, id: str) -> None:
        self.writes.schedules[id] = None

    def set_message(self, address: str, message: Message) -> None:
        key = message_key(address, message)
        self.writes.messages.pop(key, None)  # keep emission order: latest last
        self.writes.messages[key] = OutboxEntry(address, message)

    def hold_message(self, key: str, available_at: int) -> OutboxEntry | None:
        """Let the message this job wrote under ``key`` be claimed only from
        ``available_at`` on; the message, or None if the job wrote none under it.

        Not the machine's (it stays pure and per the specification): the server calls
        it after ``handle`` returned, to back off a task that keeps bouncing."""
        entry = self.written_message(key)
        if entry is not None:
            self.writes.available_at[key] = available_at
        return entry

    def written_message(self, key: str) -> OutboxEntry | None:
        """The message this job wrote under ``key``, if any (the server asks after
        ``handle`` returned; the machine never needs to)."""
        return self.writes.messages.get(key)

    def scan_promises(
        self, states: Collection[str] | None, tags: Tags, after: str | None, limit: int
    ) -> list[Promise]:
        return self.backend.scan_promises(states, tags, after, limit)

    def scan_tasks(
        self, states: Collection[str] | None, after: str | None, limit: int
    ) -> list[Task]:
        return self.backend.scan_tasks(states, after, limit)

    def scan_schedules(self, tags: Tags, after: str | None, limit: int) -> list[Schedule]:
        return self.backend.scan_schedules(tags, after, limit)

    def promises_in_branch(self, branch: str, limit: int) -> list[Promise]:
        """The branch as this job sees it: stored members plus the job's own writes
        (a fenced create answers with a ``preload`` that lists the sibling it made)."""
        found = {p.id: p for p in self.backend.promises_in_branch(branch, limit)}
        for p in self.writes.promises.values():
            if p.tags.get(TAG_BRANCH) == branch:
                found[p.id] = p
        return [found[id] for id in sorted(found)][:limit]

    def due_promises(self, now: int, limit: int) -> list[str]:
        return self.backend.due_promises(now, limit)

    def due_tasks(self, now: int, limit: int) -> list[str]:
        return self.backend.due_tasks(now, limit)

    def due_schedules(self, now: int, limit: int) -> list[str]:
        return self.backend.due_schedules(now, limit)

    def undrained_promises(self, limit: int) -> list[str]:
        return self.backend.undrained_promises(limit)

    def next_deadline(self) -> int | None:
        return self.backend.next_deadline()

    # -- flow control: the backend's rows with this job's own changes over them ------

    def flow_slot(self, task_id: str) -> str | None:
        slots = self.writes.slots
        if slots is not None and task_id in slots:
            return slots[task_id]
        return self.backend.flow_slot(task_id)

    def flow_in_use(self, group: str) -> int:
        n = self.backend.flow_in_use(group)
        for task_id, now_in in (self.writes.slots or {}).items():
            before = self.backend.flow_slot(task_id)
            n += (now_in == group) - (before == group)
        return n

    def flow_held(self, group: str, limit: int, offset: int = 0) -> list[Held]:
        mine = self.writes.held or {}
        stored = self.backend.flow_held(group, offset + limit + len(mine))
        found = [h for h in stored if h.task_id not in mine]
        found += [h for h in mine.values() if h is not None and h.group == group]
        return sorted(found, key=held_order)[offset : offset + limit]

    def flow_queued(self, task_id: str) -> Held | None:
        held = self.writes.held
        if held is not None and task_id in held:
            return held[task_id]
        return self.backend.flow_queued(task_id)

    def flow_key_in_use(self, group: str, key: str) -> int:
        n = self.backend.flow_key_in_use(group, key)
        for task_id, now_in in (self.writes.slots or {}).items():
            if self.key_of_task(task_id) == key:
                before = self.backend.flow_slot(task_id)
                n += (now_in == group) - (before == group)
        return n

    def key_of_task(self, task_id: str) -> str:
        """The ``troth:key`` of the task's promise ("" without one)."""
        promise = self.get_promise(task_id)
        return "" if promise is None else key_of(promise.tags)

    def flow_key_turn(self, group: str, key: str) -> int:
        turn = self.backend.flow_key_turn(group, key)
        for held in (self.writes.held or {}).values():
            if held is not None and held.group == group and held.key == key:
                turn = max(turn, held.turn)
        return turn

    def flow_place(self, task_id: str, group: str, key: str) -> tuple[Held | None, int]:
        """The task's place in the queue, and the last turn a new task of ``key``
        queues behind (``Backend.flow_place``), with this job's own changes."""
        held = self.writes.held or {}
        if task_id in held and held[task_id] is not None:
            return held[task_id], 0
        stored, turn = self.backend.flow_place(task_id, group, key)
        queued = None if task_id in held else stored
        turns = self.writes.turns
        if turns is not None and group in turns:
            turn = max(turn, turns[group])
        for h in held.values():
            if h is not None and h.group == group and h.key == key:
                turn = max(turn, h.turn)
        return queued, turn

    def flow_turn(self, group: str) -> int:
        turns = self.writes.turns
        if turns is not None and group in turns:
            return turns[group]
        return self.backend.flow_turn(group)

    def set_turn(self, group: str, turn: int) -> None:
        """The turn of the last task of ``group`` let through, after this job."""
        if self.writes.turns is None:
            self.writes.turns = {}
        self.writes.turns[group] = turn

    def flow_tat(self, group: str) -> float:
        tats = self.writes.tats
        if tats is not None and group in tats:
            return tats[group]
        return self.backend.flow_tat(group)

    def set_tat(self, group: str, tat: float) -> None:
        """The group's token bucket after this job's starts."""
        if self.writes.tats is None:
            self.writes.tats = {}
        self.writes.tats[group] = tat

    def take_slot(self, task_id: str, group: str | None, key: str = "") -> None:
        """The task holds a slot of ``group`` from now on (None: it frees its slot),
        counted against ``key`` (its ``troth:key``)."""
        if self.writes.slots is None:
            self.writes.slots = {}
        self.writes.slots[task_id] = group
        if key and group is not None:
            if self.writes.slot_keys is None:
                self.writes.slot_keys = {}
            self.writes.slot_keys[task_id] = key

    def queue(self, task_id: str, held: Held | None) -> None:
        """Queue the task for a slot (None: take it out of the queue)."""
        if self.writes.held is None:
            self.writes.held = {}
        self.writes.held[task_id] = held


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


class ReadOnly(Overlay):
    """The view of a read-only job: the backend's rows, with no writes of its own to
    look through first (nor a :class:`Writes` made for them), and a write refused
    where it is tried (a read that writes is a bug)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def get_promise(self, id: str) -> Promise | None:
        return self.backend.get_promise(id)

    def get_task(self, id: str) -> Task | None:
        return self.backend.get_task(id)

    def get_schedule(self, id: str) -> Schedule | None:
        return self.backend.get_schedule(id)

    def set_promise(self, promise: Promise) -> None:
        raise RuntimeError("a read-only job wrote")

    def set_task(self, task: Task) -> None:
        raise RuntimeError("a read-only job wrote")

    def set_schedule(self, schedule: Schedule) -> None:
        raise RuntimeError("a read-only job wrote")

    def del_schedule(self, id: str) -> None:
        raise RuntimeError("a read-only job wrote")

    def set_message(self, address: str, message: Message) -> None:
        raise RuntimeError("a read-only job wrote")

    def hold_message(self, key: str, available_at: int) -> OutboxEntry | None:
        raise RuntimeError("a read-only job wrote")

    def written_message(self, key: str) -> OutboxEntry | None:
        return None

    def promises_in_branch(self, branch: str, limit: int) -> list[Promise]:
        return self.backend.promises_in_branch(branch, limit)


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
    its COMMIT (``Store.claim_in_batch``): as the dispatcher's claim after a commit
    (``OutboxLifecycle.claim_due``), without a transaction and round trips of its own."""

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
    #: Set by the server's delivery: asked, on the writer thread, by a batch that
    #: wrote outbox messages, what to claim before its COMMIT (None: claim nothing
    #: now).  Only a store that overrides :meth:`take_claimed` (PostgreSQL) asks.
    claim_in_batch: Callable[[], BatchClaim | None] | None = None

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

    def reclaim(self, pages: int) -> int:
        """Give up to ``pages`` free pages back to the file system; free pages left.
        Only a SQLite file has pages to give back (retention calls it after a pass)."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""

    def take_claimed(self) -> list[OutboxRow] | None:
        """The rows the last committed batch claimed (:attr:`claim_in_batch`), taken
        once, in claim order; None when it claimed nothing itself (the delivery then
        claims after the commit)."""
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

    def execute(self, jobs: Sequence[Job[Any]]) -> list[Outcome[Any]]:
        """Run every job in its own overlay, in order, in one transaction; commit once.

        A job that raises is discarded alone.  If the commit itself fails, every job
        of the batch gets that error (nothing of the batch was acknowledged).
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

    def read(self, fn: Callable[[Overlay], T]) -> T:
        """Run one job for its answer (the timer's ``next_deadline``); meant for jobs
        that write nothing."""
        outcome: Outcome[T] = self.execute([Job(fn, 0)])[0]
        return outcome.result()
