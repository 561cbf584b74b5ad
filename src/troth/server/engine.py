"""The engine: runs requests in store transactions and drives the timer.

Every request waiting is run in one transaction (group commit: one fsync for the
batch, each request isolated in its own overlay), committed once, and answered.  One
writer thread owns the store's connection.  For a store with ``loop_batches`` (SQLite)
the event loop runs the batch itself and lends the connection to the writer thread
only for the COMMIT — the one step that waits (the fsync) — and for exclusive work
(snapshots, the outbox lifecycle, retention); the loop never waits for the disk.
Other stores' batches (PostgreSQL: round trips) run whole on the writer thread.

The timer sleeps until the store's earliest deadline.  A commit that armed an
earlier deadline wakes it at once; there is no polling tick.  Its unit of work is
``machine.core.tick`` (ARCHITECTURE rule 4): the engine loops it, and stops it on
shutdown.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from troth.engine.clock import SLICE, ClockWatch
from troth.engine.health import StoreHealth
from troth.engine.waiting import cancel_and_wait, wait_event
from troth.flow.changes import read_limits, reconcile, seed_limits
from troth.flow.gate import Flow
from troth.flow.limits import Limit
from troth.machine.core import READ_ONLY, handle, lock_keys, read, settled_keys, tick
from troth.machine.internal import Config
from troth.machine.state import Response
from troth.outbox.rows import OutboxRow
from troth.plural import counted
from troth.protocol import requests as rq
from troth.store.base import BeginWouldWait, Job, Outcome, Overlay, Store
from troth.store.faults import StoreFault, StoreUnavailable

log = logging.getLogger("troth.engine")
#: Seconds between two reads of the limits on a store shared between nodes: how long
#: a limit set on one node takes to hold on the others.
LIMITS_REFRESH = 1.0
T = TypeVar("T")

#: Requests that only read one promise, task or schedule (the machine writes nothing
#: for them: projection is computed, not stored).
POINT_READS = (rq.PromiseGet, rq.TaskGet, rq.ScheduleGet)
#: Threads that serve read-only requests off the writer (``Store.read_many``):
#: searches on SQLite (which lets go of the GIL while it steps), every read on
#: PostgreSQL.  Each takes every read waiting and answers them from one snapshot (as
#: the writer batches writes: one BEGIN/COMMIT for many reads); two overlap one
#: batch's round trips with the next one's.
READ_THREADS = 2
#: Most jobs one transaction takes.
MAX_BATCH = 256
#: Milliseconds before a timer on a shared store looks again at a due deadline that
#: another node was firing.
SHARED_RECHECK_MS = 50
#: Longest sleep of a timer on a shared store between two reads of the next deadline.
SHARED_MAX_SLEEP = 5.0
#: Seconds between two probes of a store that refuses writes (``Engine.probe``).
PROBE_INTERVAL = 1.0
#: Seconds a job (a request, a timer pass) waits for its batch's outcome before it
#: is answered without it (``Engine._expire``): a database that stopped answering
#: must not hold requests longer (docs/operations.md, "When a node is cut off from
#: its database").  Checked every :data:`DEADLINE_CHECK` seconds.
DEADLINE = 5.0
DEADLINE_CHECK = 0.25


#: What runs in a traced request's job after the machine (``Engine.submit``).
Traced = Callable[[Overlay], None]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class _Work:
    job: Job[Any] | None
    exclusive: Callable[[], Any] | None
    #: Called with the outcome, on the event loop (:func:`_deliver`).
    done: Done
    loop: asyncio.AbstractEventLoop
    #: A job's outcome was given (on the event loop): by its batch or its deadline.
    answered: bool = False
    #: When it was queued (``time.monotonic``): its deadline counts from here.
    queued: float = 0.0
    #: Exclusive work run on the event loop rather than lent (``Engine.exclusive``).
    here: bool = False


#: What takes a job's outcome, on the event loop: a future's setter, or a request's
#: own callback (``App.answer_soon``: no future, no extra pass of the loop).
Done = Callable[[Outcome[Any]], None]
#: What the writer's queue holds: a job or exclusive work (a store without
#: ``loop_batches``), something lent by the event loop (with it), or the stop mark.
_Item = _Work | Callable[[], None] | None


@dataclass(frozen=True)
class Commit:
    """What one committed batch did: its jobs, the outbox messages they wrote, and the
    due rows it claimed before its COMMIT (``Store.take_claimed``; None: none)."""

    jobs: int
    messages: int
    claimed: list[OutboxRow] | None = None


@dataclass
class EngineStats:
    batches: int = 0
    jobs: int = 0
    ticks: int = 0
    fired: int = 0
    largest_batch: int = 0
    #: How late (ms) the last timer pass that fired ran after its earliest deadline.
    lag_ms: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class Engine:
    """Owns the store's writer thread and the timer task."""

    def __init__(
        self,
        store: Store,
        config: Config,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        on_commit: Callable[[Commit], None] | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        #: Runs on the writer thread right after every commit, before the next batch
        #: starts (metrics; delivery claims the messages written there: no queue wait).
        self.on_commit = on_commit
        self.on_resume: Callable[[], None] | None = None
        #: Told of each timer pass that fired: ``(lag_ms, fired, seconds)`` (tracing).
        self.on_timer: Callable[[int, int, float], None] | None = None
        #: Runs on the writer thread after a commit that armed a deadline earlier than
        #: the one the timer sleeps until (the cluster tells the other nodes).
        self.on_deadline: Callable[[int], None] | None = None
        self.stats = EngineStats()
        #: The limits of worker groups, kept by every job that writes (``troth/flow``).
        self.flow = Flow()
        #: Whether the store takes writes (``engine/health.py``): ``/ready``, metrics.
        self.health = StoreHealth()
        #: Steps of the wall clock, as the timer notices them (``engine/clock.py``).
        self.clock_watch = ClockWatch(clock)
        self.paused = False
        #: A batch alone commits on the event loop (``lone_commit = loop``,
        #: :meth:`_commit`), not on the writer thread.
        self.lone_commit_here = True
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        #: ``loop_batches``: work waiting on the event loop; whether a run of
        #: :meth:`_kick` is scheduled; whether the connection is lent to the writer
        #: thread (a COMMIT or exclusive work in progress there).
        self._pending: collections.deque[_Work] = collections.deque()
        self._kicked = False
        self._lent = False
        self._thread: threading.Thread | None = None
        self._reads: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._readers: list[threading.Thread] = []
        self._timer: asyncio.Task[None] | None = None
        #: Reads the limits other nodes set (a store shared between nodes).
        self._limits: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._target = math.inf  # the instant the timer sleeps until
        #: Probes the store while it refuses writes (``_probing``); None otherwise.
        self._prober: asyncio.Task[None] | None = None
        self._tidying: asyncio.Future[None] | None = None
        #: Seconds a job may wait for its outcome (:data:`DEADLINE`; 0: for ever).
        self.deadline = DEADLINE
        #: Jobs queued and not yet taken into a batch, by ``id``: whoever pops one
        #: first — the thread that starts its batch, or :meth:`_expire` — owns it.
        self._unstarted: dict[int, _Work] = {}
        #: Batches under way (their jobs), by the ``id`` of their list.  Only what is
        #: queued or running is held, never a record per job answered: jobs kept
        #: alive a quarter second longer at ten thousand a second outlive the young
        #: GC generations and made old-generation collections stall the loop
        #: (measured: p99 three times longer).
        self._running: dict[int, list[_Work]] = {}
        self._watchdog: asyncio.Task[None] | None = None
        #: When the writer last finished a batch (not refused by a fault of the store)
        #: or exclusive work that did not fail (``time.monotonic``, the loop's clock;
        #: written by whichever thread finished it): :meth:`_expire` tells a store
        #: that does not answer from a node that is behind.
        self._progress = time.monotonic()

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        self.flow.load(self.store.flow_load())
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._thread = threading.Thread(target=self._writer, name="troth-writer", daemon=True)
        self._thread.start()
        if self.store.pooled_reads:
            self._readers = [
                threading.Thread(target=self._reader, name=f"troth-read-{i}", daemon=True)
                for i in range(self.store.readers or READ_THREADS)
            ]
            for reader in self._readers:
                reader.start()
        self._timer = asyncio.create_task(self._run_timer(), name="troth-timer")
        self._watchdog = asyncio.create_task(self._watch(), name="troth-deadlines")
        if self.store.shared:
            self.flow.load(await self.run(read_limits, self.clock()))
            self._limits = asyncio.create_task(self._watch_limits(), name="troth-limits")

    async def seed_limits(self, limits: list[Limit]) -> list[str]:
        """Set the limits of the ``flow_limits`` setting on the groups that have none
        in the store (``flow.changes.seed_limits``); the groups it set."""
        now = self.clock()
        fresh = await self.run(seed_limits(limits, now), now)
        self.flow.load(await self.run(read_limits, self.clock()))
        return fresh

    async def _watch_limits(self) -> None:
        """Other nodes may set or delete a limit: read them every
        :data:`LIMITS_REFRESH` seconds.  A group this node learns of has its slots
        put right (``flow.changes.reconcile``): a task this node let a worker take, or
        saw end, before it knew of the limit is counted, or no longer counted."""
        while True:
            await asyncio.sleep(LIMITS_REFRESH)
            try:
                found = await self.run(read_limits, self.clock())
                known = self.flow.limits
                self.flow.load(found)
                for limit in found:
                    if limit.group not in known:
                        await self.run(reconcile(limit.group), self.clock())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store refuses now: the next pass tries again
                log.debug("could not read the limits: %s", exc)

    async def stop(self) -> None:
        """Stop the timer, let the writer finish what was queued, close the store."""
        await cancel_and_wait(self._limits)
        self._limits = None
        await cancel_and_wait(self._timer)
        self._timer = None
        await cancel_and_wait(self._watchdog)
        self._watchdog = None
        await cancel_and_wait(self._prober)
        self._prober = None
        while self._pending or self._lent:  # loop_batches: what was queued, committed
            await asyncio.sleep(0.001)
        readers, self._readers = self._readers, []
        for _ in readers:
            self._reads.put(None)
        for reader in readers:
            await asyncio.get_running_loop().run_in_executor(None, reader.join)
        if self._thread is not None:
            self._queue.put(None)
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            self._thread = None
        self.store.close()

    # -- submitting work --------------------------------------------------------------

    async def outcome(
        self,
        fn: Callable[[Overlay], T],
        now: int,
        keys: tuple[str, ...] = (),
        *,
        read_only: bool = False,
        settles: tuple[str, ...] = (),
    ) -> Outcome[T]:
        """Run ``fn`` as one job of a batch — the writer's, or with ``read_only`` a
        reader thread's; what became of it (and what it wrote).  ``settles``: the
        ids among ``keys`` whose promises ``fn`` may settle (``Job.settles``)."""
        fut: asyncio.Future[Outcome[T]] = asyncio.get_running_loop().create_future()
        self._enqueue(fn, now, keys, read_only, functools.partial(_resolve, fut), settles)
        return await fut

    def _enqueue(
        self,
        fn: Callable[[Overlay], Any],
        now: int,
        keys: tuple[str, ...],
        read_only: bool,
        done: Done,
        settles: tuple[str, ...] = (),
    ) -> None:
        """Queue the job (on the event loop's thread); ``done`` gets its outcome, from
        its batch or, past :attr:`deadline`, from :meth:`_expire` (once)."""
        loop = asyncio.get_running_loop()
        work = _Work(Job(fn, now, keys, settles), None, done, loop, False, time.monotonic())
        work.done = functools.partial(_once, work, done)
        self._unstarted[id(work)] = work
        if read_only:
            self._reads.put(work)
        elif self.store.loop_batches:
            self._submit(work)
        else:
            self._queue.put(work)

    async def run(
        self,
        fn: Callable[[Overlay], T],
        now: int,
        keys: tuple[str, ...] = (),
        *,
        read_only: bool = False,
        settles: tuple[str, ...] = (),
    ) -> T:
        """Run ``fn`` as one job of a batch (see :meth:`outcome`); raises what the job
        raised."""
        return (await self.outcome(fn, now, keys, read_only=read_only, settles=settles)).result()

    async def exclusive(self, fn: Callable[[], T], *, here: bool = False) -> T:
        """Run ``fn`` on the writer thread between batches (reset, snapshot, ping).

        ``here`` (a store whose batches run on the event loop): on the event loop
        instead, between two batches, as they run — for short work that waits on no
        fsync (a retention batch): lent to the writer thread, every statement of it
        would wait to take the GIL back from a loop busy with requests, and the
        requests would wait for the connection that long."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Outcome[T]] = loop.create_future()
        work = _Work(None, fn, functools.partial(_resolve, done), loop)
        work.here = here and self.store.loop_batches
        if self.store.loop_batches:
            self._submit(work)
        else:
            self._queue.put(work)
        return (await done).result()

    async def request(
        self, req: rq.Req, now: int, head: dict[str, Any], traced: Traced | None = None
    ) -> Response:
        """Serve one protocol request (see :meth:`submit`)."""
        fut: asyncio.Future[Outcome[Response]] = asyncio.get_running_loop().create_future()
        response = self.submit(req, now, head, functools.partial(_resolve, fut), traced)
        return response if response is not None else (await fut).result()

    def submit(
        self,
        req: rq.Req,
        now: int,
        head: dict[str, Any],
        done: Done,
        traced: Traced | None = None,
    ) -> Response | None:
        """One protocol request: its response at once where nothing has to wait (a
        point read on SQLite), else None, and ``done`` gets its job's outcome on the
        event loop later.  Raises what a point read's job raised.

        ``traced`` (tracing on, ``server/tracing.py``) runs in the request's job after
        the machine, in its transaction: it reads the trace context the request joins
        and gives the promises the job wrote their own.  Off, it is None and each
        job pays one test of it."""

        if type(req) in READ_ONLY:
            # A read touches nothing: served off the writer (docs/architecture.md,
            # "Reads"), not queued behind its batches of writes.
            def reading(tx: Overlay) -> Response:
                response = read(tx, req, now)
                if traced is not None:
                    traced(tx)
                return response

            if isinstance(req, POINT_READS) and self.store.inline_reads:
                try:
                    return self.store.read_inline(reading)
                except StoreUnavailable:
                    pass  # the reader would have to wait: the writer answers instead
            elif self._readers:
                self._enqueue(reading, now, self._keys(req), True, done)
                return None
            self._enqueue(reading, now, self._keys(req), False, done)
            return None

        flow = self.flow

        def job(tx: Overlay) -> Response:
            response = handle(tx, req, now, self.config, head)
            if flow.limits:
                acquiring = req.id if type(req) is rq.TaskAcquire else None
                refusal = flow.keep(tx, now, acquiring)
                if refusal is not None:
                    response = refusal
            if traced is not None:
                traced(tx)
            return response

        keys = self._keys(req)
        self._enqueue(job, now, keys, False, done, settled_keys(req, keys) if keys else ())
        return None

    def _keys(self, req: rq.Req) -> tuple[str, ...]:
        return lock_keys(req) if self.store.uses_keys else ()

    async def release(
        self, req: rq.TaskRelease, now: int, head: dict[str, Any], delay_ms: int
    ) -> tuple[Response, str | None]:
        """``task.release``, its re-emitted ``execute`` (r6, same commit) held back by
        ``delay_ms`` when that is positive (the server's bounce backoff,
        ``server/bounces.py``; the machine itself is untouched); also where that
        execute went (None if the job wrote none).  The delay is a value fixed before
        the job runs, so a batch that re-runs (PostgreSQL) writes the same row."""

        def job(tx: Overlay) -> tuple[Response, str | None]:
            response = handle(tx, req, now, self.config, head)
            if response.status != 200:
                return response, None
            self.keep_limits(tx, now)
            if delay_ms > 0:
                entry = tx.hold_message(req.id, now + delay_ms)
            else:
                entry = tx.written_message(req.id)
            return response, None if entry is None else entry.address

        return await self.run(job, now, self._keys(req))

    async def tick(self, now: int) -> int:
        """Fire every step due at ``now`` until nothing more is due (``debug.tick``)."""
        total = 0
        for _ in range(1000):
            fired = await self.run(lambda tx: self._tick(tx, now), now)
            total += fired
            if fired == 0:
                break
        return total

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._poke(-math.inf)
        if self.on_resume is not None:
            self.on_resume()

    # -- batches on the event loop (loop_batches) ---------------------------------------

    def _submit(self, work: _Work) -> None:
        """Queue ``work`` on the event loop; the batch runs once the callbacks ready now
        have run (so requests read in the same loop pass share it)."""
        self._pending.append(work)
        if not self._kicked and not self._lent:
            self._kicked = True
            work.loop.call_soon(self._kick)

    def _resubmit(self, works: list[_Work]) -> None:
        for work in works:
            self._submit(work)

    def _kick(self) -> None:
        """Run what waits: exclusive work is lent to the writer thread; a batch runs
        here up to its COMMIT, which is lent to the writer thread.  Either way the
        connection comes back through :meth:`_returned`."""
        self._kicked = False
        pending = self._pending
        if self._lent or not pending:
            return
        if pending[0].exclusive is not None:
            work = pending.popleft()
            if work.here:
                self._run_here(work)
                return
            self._lend(functools.partial(self._run_exclusive, work))
            return
        works: list[_Work] = []
        while pending and len(works) < MAX_BATCH and pending[0].exclusive is None:
            work = pending.popleft()
            if self._unstarted.pop(id(work), None) is not None:  # else answered: past
                works.append(work)  # its deadline, it is not run
        if not works:  # each was answered by its deadline: on to what follows them
            if pending:
                self._kicked = True
                asyncio.get_running_loop().call_soon(self._kick)
            return
        self._running[id(works)] = works
        jobs = [w.job for w in works if w.job is not None]
        store = self.store
        store.lock.acquire()
        try:
            outcomes = store.run_open(jobs, nowait=True)
        except BeginWouldWait as exc:
            # Another process holds the file's write lock: the writer thread may wait.
            store.lock.release()
            log.debug("batch goes to the writer thread: %s", exc)
            self._lend(functools.partial(self._run_batch, works))
            return
        except BaseException as exc:
            try:
                store.rollback()
            finally:
                store.lock.release()
            self._log_failed(exc, "batch of %d failed", len(works))
            self._answer(works, [Outcome(error=exc) for _ in works], returned=False)
            self._kicked = True
            works[0].loop.call_soon(self._kick)
            return
        if self.lone_commit_here and len(works) == 1 and not pending and not outcomes[0].messages:
            self._commit(works, outcomes, here=True)
            return
        self._lend(functools.partial(self._commit, works, outcomes, here=False))

    def _lend(self, fn: Callable[[], None]) -> None:
        self._lent = True
        self._queue.put(fn)

    def _commit(self, works: list[_Work], outcomes: list[Outcome[Any]], *, here: bool) -> None:
        """Holding the store's lock the loop took: commit the batch the loop ran, and
        answer it — on the writer thread (lent the connection, which then returns to
        the loop), or ``here`` on the event loop.

        Here is for a batch alone (nothing waits behind it, it wrote no message to
        claim; ``lone_commit = loop``): lent to the writer thread, its COMMIT costs two
        hand-offs between threads (together 0.06–0.12 ms, docs/performance-notes.md
        "A lone request's time") that nothing overlaps with, since nothing waits;
        what arrives during the COMMIT is read right after it and forms the next batch
        as it would have.  The price: while this COMMIT runs (its fsync; now and then
        a WAL checkpoint, a few ms) the loop serves nothing else — no read, no SSE
        keep-alive.  ``lone_commit = writer`` keeps every COMMIT on the writer
        thread."""
        store = self.store
        try:
            store.commit()
        except BaseException as exc:
            self._log_failed(exc, "commit of a batch of %d failed", len(works))
            try:
                store.rollback()
            finally:
                outcomes = [Outcome(error=exc) for _ in works]
        finally:
            store.lock.release()
        self._answer(works, outcomes, returned=not here, here=here)

    def _returned(self, results: list[tuple[Done, Outcome[Any]]]) -> None:
        """On the event loop: the writer thread is done with the connection."""
        _deliver(results)
        self._lent = False
        if self._pending:
            # At once, after the answers just written: the requests that waited during
            # the COMMIT start their batch before the loop reads what those answers
            # bring back, so the writer thread is not left idle meanwhile (measured:
            # a pass of the loop in between made batches 50 % larger and fewer, and
            # create-settle slower).
            self._kick()

    # -- the writer thread --------------------------------------------------------------

    def _writer(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            if not isinstance(first, _Work) or first.exclusive is not None:
                self._run_alone(first)
                continue
            works = [first]
            while True:
                exclusive, stop = _drain(self._queue, works)
                works = self._start(works)
                if works:
                    self._run_batch(works)
                    works = []
                if exclusive is None:
                    break
                self._run_alone(exclusive)  # between batches, then drain on
            if stop:
                return

    def _run_alone(self, item: _Work | Callable[[], None]) -> None:
        if isinstance(item, _Work):
            self._run_exclusive(item)
        else:
            item()  # loop_batches: a COMMIT, exclusive work, a batch that may wait

    def _reader(self) -> None:
        """A reader thread: every read waiting, answered from one read snapshot; when
        the store cannot read right now, the writer answers them instead."""
        while True:
            first = self._reads.get()
            if first is None:
                return
            works = [first]
            _, stop = _drain(self._reads, works)
            works = self._start(works)
            jobs = [w.job for w in works if w.job is not None]
            if not jobs:
                if stop:
                    return
                continue
            try:
                outcomes = self.store.read_many(jobs)
            except StoreUnavailable as exc:
                self._running.pop(id(works), None)
                log.debug("reads go through the writer: %s", exc)
                for w in works:  # not started after all: the writer starts them
                    self._unstarted[id(w)] = w
                if self.store.loop_batches:
                    works[0].loop.call_soon_threadsafe(self._resubmit, works)
                else:
                    for w in works:
                        self._queue.put(w)
            except BaseException as exc:
                self._running.pop(id(works), None)
                log.exception("batch of %s failed", counted(len(works), "read"))
                failed = [(w.done, Outcome[Any](error=exc)) for w in works]
                works[0].loop.call_soon_threadsafe(_deliver, failed)
            else:
                self._running.pop(id(works), None)
                results = [(w.done, o) for w, o in zip(works, outcomes, strict=True)]
                works[0].loop.call_soon_threadsafe(_deliver, results)
            if stop:
                return

    def _start(self, works: list[_Work]) -> list[_Work]:
        """Of the jobs about to run (any thread), those not answered by their deadline
        meanwhile; each is no longer :meth:`_expire`'s to answer as not run."""
        unstarted = self._unstarted
        started = [w for w in works if unstarted.pop(id(w), None) is not None]
        if started:
            self._running[id(started)] = started
        return started

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(DEADLINE_CHECK)
            self._expire(time.monotonic())

    def _expire(self, now: float) -> None:
        """Answer every job that waited :attr:`deadline` seconds for its outcome: 503.
        A job no batch took yet is taken away and never runs; one whose batch is under
        way may still commit, and its answer says so.  Its batch's outcome, when it
        comes, finds it answered (:func:`_once`).  Only what is queued or running is
        looked at: a handful of jobs on a node that keeps up.

        If the writer finished no batch meanwhile, the store is not answering: a
        fault of the store, an episode begins (``/ready`` says so).  If it did, the
        node is only behind (more requests than its store takes): the answers say
        that, and the store's health is not in question."""
        if self.deadline <= 0:
            return
        cutoff = now - self.deadline
        late = [w for w in list(self._unstarted.values()) if w.queued <= cutoff]
        # A job's deadline counts from when it was queued, started or not.
        stuck = [w for ws in list(self._running.values()) for w in ws if w.queued <= cutoff]
        if not late and not stuck:
            return
        silent = now - self._progress >= self.deadline
        why = (
            f"the database did not answer within {self.deadline:g} s"
            if silent
            else f"the request waited {self.deadline:g} s for the store (the node is behind)"
        )
        fault: StoreFault | None = None
        for work in late:
            # Popped here or by the thread starting its batch: whoever is first owns it.
            if self._unstarted.pop(id(work), None) is not None:
                fault = StoreFault("unavailable", f"{why}; the request was not run")
                work.done(Outcome(error=fault))
        for work in stuck:
            if not work.answered:
                fault = StoreFault(
                    "unavailable", f"{why}; whether the request took effect is unknown"
                )
                work.done(Outcome(error=fault))
        if fault is not None and silent:
            self.refused(fault)

    def _run_here(self, work: _Work) -> None:
        """Exclusive work on the event loop (``here``), then what waits behind it."""
        assert work.exclusive is not None
        try:
            outcome = Outcome[Any](value=work.exclusive())
            self._progress = time.monotonic()
        except BaseException as exc:
            outcome = Outcome(error=exc)
        _deliver([(work.done, outcome)])
        if self._pending and not self._kicked:
            self._kicked = True
            work.loop.call_soon(self._kick)

    def _run_exclusive(self, work: _Work) -> None:
        assert work.exclusive is not None
        try:
            outcome = Outcome[Any](value=work.exclusive())
            self._progress = time.monotonic()
        except BaseException as exc:
            outcome = Outcome(error=exc)
        answer = self._returned if self.store.loop_batches else _deliver
        work.loop.call_soon_threadsafe(answer, [(work.done, outcome)])

    def _run_batch(self, works: list[_Work]) -> None:
        jobs = [w.job for w in works if w.job is not None]
        try:
            outcomes = self.store.execute(jobs)
        except BaseException as exc:  # the store itself broke: fail the batch
            self._log_failed(exc, "batch of %d failed", len(works))
            outcomes = [Outcome(error=exc) for _ in works]
        self._answer(works, outcomes, returned=self.store.loop_batches)

    def _answer(
        self,
        works: list[_Work],
        outcomes: list[Outcome[Any]],
        *,
        returned: bool,
        here: bool = False,
    ) -> None:
        """After a batch (committed or failed): count it, answer its requests, wake the
        timer for an earlier deadline, run :attr:`on_commit`; with ``returned``, give
        the connection back to the event loop (:meth:`_returned`); ``here``: on the
        event loop (answered at once)."""
        progress = time.monotonic()
        self._running.pop(id(works), None)
        self.stats.batches += 1
        self.stats.jobs += len(works)
        self.stats.largest_batch = max(self.stats.largest_batch, len(works))
        failed = outcomes[0].error if outcomes else None
        if failed is not None and all(o.error is failed for o in outcomes):
            # The batch failed whole: a fault of the store is its reason for every job
            # (503, the message says why) and an episode of store health.
            fault = self.store.refused(failed)
            if fault is not None:
                if fault is not failed:
                    outcomes = [Outcome(error=fault) for _ in outcomes]
                self.refused(fault)
                progress = self._progress  # the store did not answer: no progress
        else:
            health = self.health
            health.last_write = health.clock()  # /ready needs no probe of a busy store
            if health.fault is not None and any(o.wrote for o in outcomes):
                self._writable()
        self._progress = progress
        earliest = math.inf
        messages = 0
        for o in outcomes:
            messages += o.messages
            if o.deadline is not None:
                earliest = min(earliest, o.deadline)
        results = [(w.done, o) for w, o in zip(works, outcomes, strict=True)]
        loop = works[0].loop
        if here:
            _deliver(results)
        else:
            loop.call_soon_threadsafe(_deliver, results)
        if earliest < self._target:
            loop.call_soon_threadsafe(self._poke, earliest)
            if self.on_deadline is not None:
                try:
                    self.on_deadline(int(earliest))
                except Exception as exc:  # a courtesy to other nodes: never fatal here
                    log.warning("could not announce deadline %d: %s", earliest, exc)
        if self.on_commit is not None:
            try:
                self.on_commit(Commit(len(works), messages, self.store.take_claimed()))
            except Exception:  # a bug there must not wedge the engine: log it, go on
                log.exception("on_commit failed after a batch of %d", len(works))
        if returned:
            # After on_commit: the delivery's claim uses the connection too.
            loop.call_soon_threadsafe(self._returned, [])

    # -- store health -----------------------------------------------------------------

    def fault(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a fault of the store (full, read-only, out of reach) met
        outside the engine's batches (delivery, retention): then it counts as a refused
        commit of :attr:`health`, which logs the episode once, and the caller logs it
        at most at debug level — not a traceback a second while the disk is full."""
        fault = self.store.refused(exc)
        if fault is None:
            return False
        self.refused(fault)
        return True

    def _log_failed(self, exc: BaseException, message: str, n: int) -> None:
        """A batch failed whole: a traceback for a bug; nothing for a fault of the
        store, which :attr:`health` logs once per episode."""
        if self.store.refused(exc) is None:
            log.error(message, n, exc_info=exc)

    def refused(self, fault: StoreFault) -> None:
        """A commit was refused for ``fault`` (any thread): counted; the first of an
        episode starts the probes that will see it end."""
        if self.health.failed(fault) and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._start_probing)
            except RuntimeError:  # the loop has closed: the node is stopping
                pass

    def _writable(self) -> None:
        """A write committed (any thread): the episode under way ends; the store then
        tidies up after it (a SQLite WAL that grew is given back), between batches."""
        if self.health.committed() is not None and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._tidy)
            except RuntimeError:
                pass

    def _tidy(self) -> None:
        async def tidy() -> None:
            try:
                await self.exclusive(self.store.recovered)
            except Exception as exc:  # a courtesy: the next checkpoints do it too
                log.warning("tidying up after a store fault failed: %s", exc)

        # Held: a task nothing holds may be collected before it ends.
        self._tidying = asyncio.ensure_future(tidy())

    def _start_probing(self) -> None:
        if self._prober is None or self._prober.done():
            self._prober = asyncio.ensure_future(self._probing())

    async def _probing(self) -> None:
        """While the store refuses writes: a probe every :data:`PROBE_INTERVAL` seconds,
        so that the episode ends when the fault does even if no request comes (a load
        balancer sends none to a node that is not ready)."""
        while self.health.fault is not None:
            await asyncio.sleep(PROBE_INTERVAL)
            await self.probe()

    async def probe(self, *, write: bool = True) -> StoreFault | None:
        """Commit the store's probe write (``Store.probe``; without ``write`` only ping
        it) between batches: the fault it met (also an episode's, as a batch's would
        be), or None.  A probe's success ends an episode only if no batch was refused
        while it waited: a store that takes the probe's small write but refuses
        requests' (a nearly full disk) stays not ready."""
        before = self.health.refusals
        try:
            await self.exclusive(self.store.probe if write else self.store.ping)
        except Exception as exc:
            fault = self.store.refused(exc)
            if fault is None:
                fault = StoreFault("unavailable", str(exc) or type(exc).__name__)
            self.refused(fault)
            return fault
        if write and self.health.refusals == before:
            self._writable()
        return self.health.fault

    # -- the timer ------------------------------------------------------------------------

    def hint(self, instant: int) -> None:
        """Another node armed a deadline at ``instant`` (event-loop thread only)."""
        self._poke(instant)

    def _poke(self, instant: float) -> None:
        if instant < self._target and self._wake is not None:
            self._target = instant
            self._wake.set()

    async def _run_timer(self) -> None:
        assert self._wake is not None
        while True:
            self._wake.clear()
            if self.paused:
                self._target = math.inf
                await self._wake.wait()
                continue
            try:
                deadline = await self.exclusive(self._next_deadline)
                now = self.clock()
                if deadline is not None and deadline <= now:
                    # Late by the wall clock, not counting a step of it (clock_watch).
                    self.stats.lag_ms = max(now - max(deadline, self.clock_watch.stepped_at), 0)
                    began = time.perf_counter()
                    passed = await self.outcome(functools.partial(self._tick, now=now), now)
                    if passed.error is not None:
                        raise passed.error
                    self.stats.ticks += 1
                    self.stats.fired += passed.value or 0
                    if self.on_timer is not None:
                        self.on_timer(
                            self.stats.lag_ms, passed.value or 0, time.perf_counter() - began
                        )
                    if passed.wrote:
                        continue
                    if self.store.shared:
                        # Another node holds the due rows (SKIP LOCKED passed them
                        # over) and is firing them; look again shortly.
                        deadline = now + SHARED_RECHECK_MS
                    else:
                        # Due but nothing to change (an orphan row): do not spin on it.
                        log.warning(
                            "deadline %d due at %d changed nothing; backing off", deadline, now
                        )
                        deadline = now + 1000
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, StoreFault):  # logged once per episode (health)
                    log.debug("timer pass: %s; retrying in 1 s", exc)
                elif isinstance(exc, StoreUnavailable):  # the database is away: no traceback
                    log.warning("timer pass: %s; retrying in 1 s", exc)
                else:
                    log.exception("timer pass failed; retrying in 1 s")
                deadline = now = self.clock()
                deadline += 1000
            self._target = math.inf if deadline is None else deadline
            delay = None if deadline is None else max(deadline - self.clock(), 0) / 1000
            if self.store.shared and (delay is None or delay > SHARED_MAX_SLEEP):
                # Other nodes announce earlier deadlines, but one that crashed between
                # its commit and its announcement would not: look again now and then.
                delay = SHARED_MAX_SLEEP
            await self._sleep(deadline, delay)

    async def _sleep(self, deadline: int | None, delay: float | None) -> None:
        """Until woken, until ``delay`` seconds passed, or until the wall clock reached
        ``deadline``, whichever comes first — in slices of at most :data:`SLICE`
        seconds, reading the wall clock after each: sleeps run on the monotonic clock,
        which a step of the wall clock does not move (``engine/clock.py``)."""
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        end = None if delay is None else loop.time() + delay
        while True:
            nap = SLICE
            if end is not None:
                nap = min(nap, max(end - loop.time(), 0.0))
            if deadline is not None:
                nap = min(nap, max(deadline - self.clock(), 0) / 1000)
            woken = await wait_event(self._wake, nap)
            # Woken or not (a busy timer too), before the pass that fires what a step
            # made due: its lag is then measured from the step.
            self.clock_watch.observe()
            if woken:
                return
            if end is not None and loop.time() >= end:
                return
            if deadline is not None and self.clock() >= deadline:
                return

    def _tick(self, tx: Overlay, now: int) -> int:
        fired = tick(tx, now, self.config)
        self.keep_limits(tx, now)
        return fired

    def keep_limits(self, tx: Overlay, now: int) -> None:
        """After the machine, in a job that is not a client's request (a timer pass, a
        release, an operator's settles): keep the group limits (``troth/flow``)."""
        if self.flow.limits:
            self.flow.keep(tx, now)

    def _next_deadline(self) -> int | None:
        return self.store.read(lambda tx: tx.next_deadline())


def _drain(
    waiting: queue.SimpleQueue[_Item] | queue.SimpleQueue[_Work | None], works: list[_Work]
) -> tuple[_Work | Callable[[], None] | None, bool]:
    """Move the jobs waiting in ``waiting`` to ``works`` (up to :data:`MAX_BATCH`),
    without blocking; stop at an exclusive item (returned: it runs between batches)
    or at the stop mark (``True``)."""
    while len(works) < MAX_BATCH:
        try:
            nxt = waiting.get_nowait()
        except queue.Empty:
            return None, False
        if nxt is None:
            return None, True
        if not isinstance(nxt, _Work) or nxt.exclusive is not None:
            return nxt, False
        works.append(nxt)
    return None, False


def _deliver(results: list[tuple[Done, Outcome[Any]]]) -> None:
    for done, outcome in results:
        try:
            done(outcome)
        except Exception:  # one request's callback must not keep the others unanswered
            log.exception("answering a job's outcome failed")


def _once(work: _Work, done: Done, outcome: Outcome[Any]) -> None:
    """``done`` with the first outcome of ``work`` (its batch's, or its deadline's)."""
    if not work.answered:
        work.answered = True
        done(outcome)


def _resolve(fut: asyncio.Future[Outcome[Any]], outcome: Outcome[Any]) -> None:
    if not fut.done():  # its awaiter may have been cancelled
        fut.set_result(outcome)
