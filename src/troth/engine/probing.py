"""Store health as the engine sees it, and the probe that ends an episode.

A fault of the store (full, read-only, out of reach: ``store/faults.py``) met by a
batch, the timer, delivery or retention is counted once in
:class:`~troth.engine.health.StoreHealth`, which logs the episode; while it lasts,
the engine commits a small probe write every :data:`PROBE_INTERVAL` seconds, so the
episode ends when the fault does even if no request comes (a load balancer sends
none to a node that is not ready).  When writes commit again, the store tidies up
after the episode between batches (``Store.recovered``).
"""

from __future__ import annotations

import asyncio
import logging

from troth.engine.base import EngineBase
from troth.store.faults import StoreFault

log = logging.getLogger("troth.engine")

#: Seconds between two probes of a store that refuses writes (``Engine.probe``).
PROBE_INTERVAL = 1.0


class Probing(EngineBase):
    """Counts the store's faults and probes it while it refuses writes."""

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
