"""Batches on the event loop, for a store with ``loop_batches`` (SQLite).

The loop runs a batch itself, up to its COMMIT, and lends the connection to the
writer thread only for the steps that wait: the COMMIT (its fsync), exclusive work
(snapshots, the outbox lifecycle), a batch whose BEGIN would wait on another
process's lock.  So the loop never waits for the disk, and a request read in the
same pass of the loop as others shares their batch without a hop between threads.
A batch alone may commit here too (``lone_commit = loop``,
:meth:`LoopBatches._commit`).  The connection comes back through
:meth:`LoopBatches._returned`, which starts the next batch at once.

Exclusive work ``here`` (a retention batch) runs on the loop: alone between
batches, or, when it has an ``inside`` and requests wait, riding in their batch
(:meth:`LoopBatches._ride`) so that it shares their COMMIT.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from troth.engine.base import EngineBase
from troth.engine.work import MAX_BATCH, Done, Work, deliver
from troth.store.base import BeginWouldWait, Outcome

log = logging.getLogger("troth.engine")


class LoopBatches(EngineBase):
    """Runs batches on the event loop and lends the connection for what waits."""

    def _submit(self, work: Work) -> None:
        """Queue ``work`` on the event loop; the batch runs once the callbacks ready now
        have run (so requests read in the same loop pass share it)."""
        self._pending.append(work)
        if not self._kicked and not self._lent:
            self._kicked = True
            work.loop.call_soon(self._kick)

    def _resubmit(self, works: list[Work]) -> None:
        for work in works:
            self._submit(work)

    def _kick(self) -> None:
        """Run what waits: exclusive work is lent to the writer thread (or run here);
        a batch runs here up to its COMMIT, which is lent to the writer thread, with
        at most one piece of exclusive work that may ride in it (``inside``) run
        after its jobs.  Either way the connection comes back through
        :meth:`_returned`."""
        self._kicked = False
        pending = self._pending
        if self._lent or not pending:
            return
        head = pending[0]
        if head.exclusive is not None and not _rides(pending):
            work = pending.popleft()
            if work.here:
                self._run_here(work)
                return
            self._lend(functools.partial(self._run_exclusive, work))
            return
        works: list[Work] = []
        rider: Work | None = None  # exclusive work that rides in this batch (``inside``)
        while pending and len(works) < MAX_BATCH:
            work = pending[0]
            if work.exclusive is not None:
                if rider is not None or work.inside is None:
                    break
                rider = pending.popleft()
                continue
            pending.popleft()
            if self._unstarted.pop(id(work), None) is not None:  # else answered: past
                works.append(work)  # its deadline, it is not run
        if not works:  # each was answered by its deadline: on to what follows them
            if rider is not None:
                pending.appendleft(rider)  # it runs alone
            if pending:
                self._kicked = True
                asyncio.get_running_loop().call_soon(self._kick)
            return
        self._running[id(works)] = works
        jobs = [w.job for w in works if w.job is not None]
        store = self.store
        store.lock.acquire()
        ridden: Outcome[Any] | None = None
        try:
            outcomes = store.run_open(jobs, nowait=True)
            if rider is not None:
                ridden = self._ride(rider)
        except BeginWouldWait as exc:
            # Another process holds the file's write lock: the writer thread may wait.
            store.lock.release()
            log.debug("batch goes to the writer thread: %s", exc)
            if rider is not None:
                pending.appendleft(rider)  # after the batch, alone or with the next
            self._lend(functools.partial(self._run_batch, works))
            return
        except BaseException as exc:
            try:
                store.rollback()
            finally:
                store.lock.release()
            self._log_failed(exc, "batch of %d failed", len(works))
            self._answer(works, [Outcome(error=exc) for _ in works], returned=False)
            if rider is not None:
                deliver([(rider.done, Outcome(error=exc))])
            self._kicked = True
            works[0].loop.call_soon(self._kick)
            return
        if rider is not None:
            assert ridden is not None
            # Its result holds once the batch's COMMIT has, which is lent as ever.
            commit = functools.partial(
                self._commit, works, outcomes, here=False, rider=(rider, ridden)
            )
            self._lend(commit)
            return
        if self.lone_commit_here and len(works) == 1 and not pending and not outcomes[0].messages:
            self._commit(works, outcomes, here=True)
            return
        self._lend(functools.partial(self._commit, works, outcomes, here=False))

    def _ride(self, rider: Work) -> Outcome[Any]:
        """In the batch's open transaction, after its jobs: ``rider.inside`` under a
        savepoint, so that its failure undoes only its own writes and never the
        requests'.  (A savepoint that cannot be rolled back to raises: the connection
        is broken, and the batch fails as any whose store broke.)"""
        assert rider.inside is not None
        store = self.store
        store.savepoint()
        try:
            value = rider.inside()
        except Exception as exc:
            store.rollback_to()
            return Outcome(error=exc)
        store.release()
        return Outcome(value=value)

    def _lend(self, fn: Callable[[], None]) -> None:
        self._lent = True
        self._queue.put(fn)

    def _commit(
        self,
        works: list[Work],
        outcomes: list[Outcome[Any]],
        *,
        here: bool,
        rider: tuple[Work, Outcome[Any]] | None = None,
    ) -> None:
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
        thread.

        ``rider``: exclusive work that ran in this transaction (:meth:`_ride`), and
        its outcome, which it is told once the COMMIT has held (or why it did not)."""
        store = self.store
        try:
            store.commit()
        except BaseException as exc:
            self._log_failed(exc, "commit of a batch of %d failed", len(works))
            try:
                store.rollback()
            finally:
                outcomes = [Outcome(error=exc) for _ in works]
                if rider is not None:
                    rider = (rider[0], Outcome(error=exc))
        finally:
            store.lock.release()
        if rider is not None:
            ridden = [(rider[0].done, rider[1])]
            if here:
                deliver(ridden)
            else:
                rider[0].loop.call_soon_threadsafe(deliver, ridden)
        self._answer(works, outcomes, returned=not here, here=here)

    def _returned(self, results: list[tuple[Done, Outcome[Any]]]) -> None:
        """On the event loop: the writer thread is done with the connection."""
        deliver(results)
        self._lent = False
        if self._pending:
            # At once, after the answers just written: the requests that waited during
            # the COMMIT start their batch before the loop reads what those answers
            # bring back, so the writer thread is not left idle meanwhile (measured:
            # a pass of the loop in between made batches 50 % larger and fewer, and
            # create-settle slower).
            self._kick()

    def _run_here(self, work: Work) -> None:
        """Exclusive work on the event loop (``here``), then what waits behind it."""
        assert work.exclusive is not None
        try:
            outcome = Outcome[Any](value=work.exclusive())
            self._progress = time.monotonic()
        except BaseException as exc:
            outcome = Outcome(error=exc)
        deliver([(work.done, outcome)])
        if self._pending and not self._kicked:
            self._kicked = True
            work.loop.call_soon(self._kick)


def _rides(pending: collections.deque[Work]) -> bool:
    """Whether the exclusive work at the head of ``pending`` may ride in a batch of
    the requests right behind it (``Engine.exclusive``'s ``inside``)."""
    return pending[0].inside is not None and len(pending) > 1 and pending[1].exclusive is None
