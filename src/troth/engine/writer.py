"""The threads that own the store's connections: one writer, and readers.

The writer thread takes every job waiting and runs them as one batch (group commit:
one fsync for the batch; a store without ``loop_batches``, PostgreSQL, runs its
round trips here), runs exclusive work between batches, and on a store with
``loop_batches`` runs what the event loop lends it (a COMMIT, exclusive work).
Reader threads (``Store.pooled_reads``) answer read-only requests from one snapshot
per batch of them, off the writer, so that reads do not queue behind writes.
Whichever thread starts a job takes it from the watchdog's view of jobs not yet
started (:meth:`Writer._start`): a job is run, or answered as not run, never both.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from troth.engine.base import EngineBase
from troth.engine.work import Work, deliver, drain
from troth.plural import counted
from troth.store.base import Outcome
from troth.store.faults import StoreUnavailable

log = logging.getLogger("troth.engine")

#: Threads that serve read-only requests off the writer (``Store.read_many``):
#: searches on SQLite (which lets go of the GIL while it steps), every read on
#: PostgreSQL.  Each takes every read waiting and answers them from one snapshot (as
#: the writer batches writes: one BEGIN/COMMIT for many reads); two overlap one
#: batch's round trips with the next one's.
READ_THREADS = 2


class Writer(EngineBase):
    """The writer thread and the reader threads."""

    def _writer(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            if not isinstance(first, Work) or first.exclusive is not None:
                self._run_alone(first)
                continue
            works = [first]
            while True:
                exclusive, stop = drain(self._queue, works)
                works = self._start(works)
                if works:
                    self._run_batch(works)
                    works = []
                if exclusive is None:
                    break
                self._run_alone(exclusive)  # between batches, then drain on
            if stop:
                return

    def _run_alone(self, item: Work | Callable[[], None]) -> None:
        if isinstance(item, Work):
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
            _, stop = drain(self._reads, works)
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
                works[0].loop.call_soon_threadsafe(deliver, failed)
            else:
                self._running.pop(id(works), None)
                results = [(w.done, o) for w, o in zip(works, outcomes, strict=True)]
                works[0].loop.call_soon_threadsafe(deliver, results)
            if stop:
                return

    def _start(self, works: list[Work]) -> list[Work]:
        """Of the jobs about to run (any thread), those not answered by their deadline
        meanwhile; each is no longer :meth:`_expire`'s to answer as not run."""
        unstarted = self._unstarted
        started = [w for w in works if unstarted.pop(id(w), None) is not None]
        if started:
            self._running[id(started)] = started
        return started

    def _run_exclusive(self, work: Work) -> None:
        assert work.exclusive is not None
        try:
            outcome = Outcome[Any](value=work.exclusive())
            self._progress = time.monotonic()
        except BaseException as exc:
            outcome = Outcome(error=exc)
        answer = self._returned if self.store.loop_batches else deliver
        work.loop.call_soon_threadsafe(answer, [(work.done, outcome)])

    def _run_batch(self, works: list[Work]) -> None:
        jobs = [w.job for w in works if w.job is not None]
        try:
            outcomes = self.store.execute(jobs, self.claim_in_batch)
        except BaseException as exc:  # the store itself broke: fail the batch
            self._log_failed(exc, "batch of %d failed", len(works))
            outcomes = [Outcome(error=exc) for _ in works]
        self._answer(works, outcomes, returned=self.store.loop_batches)
