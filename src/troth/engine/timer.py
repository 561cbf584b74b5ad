"""The timer: fires the protocol's deadlines when the wall clock reaches them.

It sleeps until the store's earliest deadline.  A commit that armed an earlier
deadline wakes it at once (``_poke``), as does another node's announcement
(``hint``); there is no polling tick.  On PostgreSQL the next deadline is read on
a session of its own, off the writer (``Store.deadline_apart``), within bounds
(``_bounds``); a deadline that a batch commits while the timer reads is noted
(``_poke``), not lost.  Its unit of work is ``machine.core.tick`` (ARCHITECTURE rule
4): the engine loops it, one transaction per pass, and stops it on shutdown.  Sleeps
run in slices that read the wall clock (``engine/clock.py``), so a step of the clock
neither delays what it made due nor fires anything early.  On a store shared between
nodes, another node may be firing the same due rows, or may have crashed before it
announced a deadline: the timer looks again shortly, and reads the next deadline at
least every :data:`SHARED_MAX_SLEEP` seconds.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time

from troth.engine.base import EngineBase
from troth.engine.clock import SLICE
from troth.machine.core import tick
from troth.protocol.records import EARLIEST
from troth.store.base import Overlay
from troth.store.faults import StoreFault, StoreUnavailable
from troth.waiting import wait_event

log = logging.getLogger("troth.engine")

#: Milliseconds before a timer on a shared store looks again at a due deadline that
#: another node was firing.
SHARED_RECHECK_MS = 50
#: Longest sleep of a timer on a shared store between two reads of the next deadline.
SHARED_MAX_SLEEP = 5.0
#: Seconds between two reads of a store apart (PostgreSQL) that look below the floor
#: (:meth:`Timer._bounds`): what another node committed and crashed before announcing.
FULL_READ_EVERY = 60.0
#: Milliseconds below the wall clock that the floor reaches at least.
FLOOR_SLACK_MS = 1000


class Timer(EngineBase):
    """The timer task and its wake-ups."""

    def hint(self, instant: int) -> None:
        """Another node armed a deadline at ``instant`` (event-loop thread only)."""
        self._poke(instant)

    def _poke(self, instant: float) -> None:
        """A deadline committed at ``instant`` (event loop only): the floor of the next
        read goes down to it; while the timer reads it is kept for the target about to
        be set (the read may have begun before the commit); earlier than the target,
        it wakes the timer."""
        self._floor = min(self._floor, instant)
        if self._reading:
            self._noted = min(self._noted, instant)
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
            # From the read until the new target is set, a commit that arms a
            # deadline later than the old target is noted (commits.py, _poke): the
            # read may have begun before that commit.
            self._reading = True
            self._noted = math.inf
            try:
                if self.store.deadline_apart:
                    read_at = self.clock()
                    within = self._bounds(read_at)
                    deadline = await asyncio.to_thread(self.store.next_deadline, within)
                    self._floor = min(
                        read_at - FLOOR_SLACK_MS,
                        math.inf if deadline is None else deadline,
                        self._noted,
                    )
                    if deadline is None:
                        # Nothing up to the read's end: read again then.  A commit that
                        # arms a later deadline has no need to wake the timer before.
                        deadline = within[1]
                else:
                    deadline = await self.exclusive(self.store.next_deadline)
                now = self.clock()
                if self.paused:
                    # Paused while the deadline was read (debug.start): what was
                    # created since must not be fired by the wall clock.
                    self._reading = False
                    continue
                if deadline is not None and deadline <= now:
                    # Late by the wall clock, not counting a step of it (clock_watch).
                    self.stats.lag_ms = max(now - max(deadline, self.clock_watch.stepped_at), 0)
                    began = time.perf_counter()
                    tick_since = functools.partial(self._tick, now=now, since=self._since())
                    passed = await self.outcome(tick_since, now)
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
            if self._noted < (math.inf if deadline is None else deadline):
                deadline = int(self._noted)
            self._target = math.inf if deadline is None else deadline
            self._reading = False
            delay = None if deadline is None else max(deadline - self.clock(), 0) / 1000
            if self.store.shared and (delay is None or delay > SHARED_MAX_SLEEP):
                # Other nodes announce earlier deadlines, but one that crashed between
                # its commit and its announcement would not: look again now and then.
                delay = SHARED_MAX_SLEEP
            await self._sleep(deadline, delay)

    def _bounds(self, now: int) -> tuple[int, int]:
        """The range of deadlines a read apart looks at (PostgreSQL).

        Up to :data:`SHARED_MAX_SLEEP` ahead: the timer of a shared store reads again
        by then anyway.  From the floor up: the earliest deadline the last read found
        (what it left due is not below it), or a second before that read began, or
        any deadline committed or announced since, whichever is lowest.  A deadline
        below the floor can only be one another node committed and crashed before
        announcing: every :data:`FULL_READ_EVERY` seconds a read looks from the
        bottom.  While a snapshot holds the horizon back, a partial index's low end
        fills with dead entries that every read would walk; the floor skips them.
        """
        high = now + int(SHARED_MAX_SLEEP * 1000)
        at = time.monotonic()
        if self._floor == -math.inf or at - self._full_at >= FULL_READ_EVERY:
            self._full_at = at
            return EARLIEST, high
        return int(self._floor), high

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

    def _since(self) -> int:
        """Where a pass's due lists start: the floor of the reads (:meth:`_bounds`) on a
        store read apart, for below it no deadline is alive but one another node
        committed and crashed before announcing, which the next read from the bottom
        finds and so lowers the floor.  Elsewhere, from the bottom."""
        if not self.store.deadline_apart or self._floor == -math.inf:
            return EARLIEST
        return max(int(self._floor), EARLIEST)

    def _tick(self, tx: Overlay, now: int, since: int = EARLIEST) -> int:
        fired = tick(tx, now, self.config, since)
        self.keep_limits(tx, now)
        return fired
