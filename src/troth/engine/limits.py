"""Flow control's part in the engine: the limits every job that writes keeps.

The limits themselves are ``troth/flow``: what a limit is, and how a job keeps to
it (``Flow.keep``, run inside the job's transaction).  The engine loads them at
start, seeds those of the ``flow_limits`` setting, keeps them in the jobs that are
not a client's request (a timer pass, a release, an operator's settles), and on a
store shared between nodes reads them again every :data:`LIMITS_REFRESH` seconds,
since another node may set or delete one.
"""

from __future__ import annotations

import asyncio
import logging

from troth.engine.base import EngineBase
from troth.flow.changes import read_limits, reconcile, seed_limits
from troth.flow.limits import Limit
from troth.store.base import Overlay

log = logging.getLogger("troth.engine")

#: Seconds between two reads of the limits on a store shared between nodes: how long
#: a limit set on one node takes to hold on the others.
LIMITS_REFRESH = 1.0


class Limits(EngineBase):
    """Loads, seeds, refreshes and keeps the worker groups' limits."""

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

    def keep_limits(self, tx: Overlay, now: int) -> None:
        """After the machine, in a job that is not a client's request (a timer pass, a
        release, an operator's settles): keep the group limits (``troth/flow``)."""
        if self.flow.limits:
            self.flow.keep(tx, now)
