"""The wall clock as the timer sees it: steps noticed, measured and reported.

The protocol's times are wall-clock milliseconds (``timeoutAt``, a lease's expiry,
a retry, a schedule's next run), so the timer fires each when the wall clock
reaches it.  Sleeps, though, run on the monotonic clock (asyncio's), which a step
of the wall clock — an NTP correction, a VM resumed or migrated, a laptop waking —
does not move.  So the timer never sleeps longer than :data:`SLICE` before it reads
the wall clock again (``Engine._sleep``): after a step forward, what became due
fires within that slice; after a step back, nothing fires before its wall-clock
time.  :class:`ClockWatch` compares the two clocks at each of those readings and
reports a step of more than :data:`JUMP_MS`: a warning, ``troth_clock_jumps_total``
and ``troth_clock_last_jump_seconds``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

log = logging.getLogger("troth.clock")

#: Longest sleep of the timer between two readings of the wall clock (seconds).
SLICE: Final = 1.0
#: A change of the wall clock's offset from the monotonic clock beyond this (ms) is
#: a step; below it, slewing and scheduling noise.
JUMP_MS: Final = 1000


class ClockWatch:
    """Notices steps of the wall clock against the monotonic one."""

    def __init__(
        self,
        wall: Callable[[], int],
        monotonic: Callable[[], float] = time.monotonic,
        on_jump: Callable[[int], None] | None = None,
    ) -> None:
        self.wall = wall
        self.monotonic = monotonic
        self.jumps = 0
        #: The last step, in ms (negative: backwards).
        self.last_jump_ms = 0
        #: The wall-clock instant (ms) at which the last forward step was noticed:
        #: deadlines it skipped over are not "late" before it.
        self.stepped_at = 0
        #: Called with each step (ms): the metrics' counter.
        self.on_jump = on_jump
        self._offset = self._read()

    def _read(self) -> float:
        return self.wall() - self.monotonic() * 1000

    def observe(self) -> int:
        """Compare the clocks now; the step (ms) since the last look, or 0."""
        offset = self._read()
        step = round(offset - self._offset)
        self._offset = offset
        if abs(step) <= JUMP_MS:
            return 0
        self.jumps += 1
        self.last_jump_ms = step
        if step > 0:
            self.stepped_at = self.wall()
        if self.on_jump is not None:
            self.on_jump(step)
        log.warning(
            "the wall clock stepped %s by %.1f s; timers follow it (%s)",
            "forward" if step > 0 else "back",
            abs(step) / 1000,
            "what it skipped over fires now" if step > 0 else "nothing fires before its time",
        )
        return step
