"""The watchdog: no job waits longer than ``Engine.deadline`` for its outcome.

A database that stopped answering (cut off, failing over, a lock held elsewhere)
would otherwise hold every request for as long as it is away.  Every
:data:`DEADLINE_CHECK` seconds the watchdog answers each job that waited too long
with a 503 — one never started is never run; one whose batch is under way may still
commit, and its answer says so — and tells a store that is not answering (the
writer finished nothing meanwhile: an episode of store health) from a node that is
only behind.
"""

from __future__ import annotations

import asyncio
import time

from troth.engine.base import EngineBase
from troth.store.base import Outcome
from troth.store.faults import StoreFault

#: Seconds between two looks at the jobs waiting (``Engine._expire``).
DEADLINE_CHECK = 0.25


class Watchdog(EngineBase):
    """Answers the jobs that waited past their deadline."""

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(DEADLINE_CHECK)
            self._expire(time.monotonic())

    def _expire(self, now: float) -> None:
        """Answer every job that waited :attr:`deadline` seconds for its outcome: 503.
        A job no batch took yet is taken away and never runs; one whose batch is under
        way may still commit, and its answer says so.  Its batch's outcome, when it
        comes, finds it answered (:func:`once`).  Only what is queued or running is
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
