"""The engine's request API: how a caller hands it work and gets the outcome back.

``submit`` (a protocol request, answered through a callback: the app's fast path),
``request`` (the same, awaited), ``run``/``outcome`` (any job: retention, cancel,
delivery's lifecycle calls), ``exclusive`` (work between batches: snapshots, the
probe), ``release`` and ``tick``; and ``pause``/``resume`` (``debug.*``).  Each
turns into a :class:`~troth.engine.work.Work` on the right queue — a reader thread
for reads that may run off the writer, the event loop's batch on a store with
``loop_batches``, else the writer thread — so that callers need not know which
store they run on.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Callable
from typing import Any

from troth.engine.base import EngineBase, T
from troth.engine.work import Done, Traced, Work, once, resolve
from troth.machine.core import READ_ONLY, handle, lock_keys, read, settled_keys
from troth.machine.state import Response
from troth.protocol import requests as rq
from troth.store.base import Job, Outcome, Overlay
from troth.store.faults import StoreUnavailable

#: Requests that only read one promise, task or schedule (the machine writes nothing
#: for them: projection is computed, not stored).
POINT_READS = (rq.PromiseGet, rq.TaskGet, rq.ScheduleGet)


class Requests(EngineBase):
    """Submitting work: requests, jobs and exclusive work (see the module)."""

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
        self._enqueue(fn, now, keys, read_only, functools.partial(resolve, fut), settles)
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
        work = Work(Job(fn, now, keys, settles), None, done, loop, False, time.monotonic())
        work.done = functools.partial(once, work, done)
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

    async def exclusive(
        self, fn: Callable[[], T], *, here: bool = False, inside: Callable[[], T] | None = None
    ) -> T:
        """Run ``fn`` on the writer thread between batches (reset, snapshot, ping).

        ``here`` (a store whose batches run on the event loop): on the event loop
        instead, between two batches, as they run — for short work that waits on no
        fsync (a retention batch): lent to the writer thread, every statement of it
        would wait to take the GIL back from a loop busy with requests, and the
        requests would wait for the connection that long.

        ``inside`` (with ``here``): when requests wait too, run ``inside`` instead,
        in their batch's transaction after their jobs, under a savepoint (its failure
        rolls back only itself), and answer with its result once that batch has
        committed.  Work that would commit alone then shares the batch's COMMIT — its
        fsync and its WAL writes, which run off the event loop; alone, ``fn`` runs as
        ``here`` says."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Outcome[T]] = loop.create_future()
        work = Work(None, fn, functools.partial(resolve, done), loop)
        work.here = here and self.store.loop_batches
        work.inside = inside if work.here else None
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
        response = self.submit(req, now, head, functools.partial(resolve, fut), traced)
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
        ``server/delivery/bounces.py``; the machine itself is untouched); also where that
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
        """``debug.start`` (event loop only): the timer stops firing by the wall clock,
        woken so that it stops now, not when its sleep would have ended (up to
        ``SHARED_MAX_SLEEP`` on a shared store)."""
        self.paused = True
        if self._wake is not None:
            self._wake.set()

    def resume(self) -> None:
        self.paused = False
        self._poke(-math.inf)
        if self.on_resume is not None:
            self.on_resume()
