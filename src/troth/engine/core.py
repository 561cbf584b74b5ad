"""The engine: one object that runs requests in store transactions and drives the timer.

:class:`Engine` assembles the parts (one module each, see ``engine/base.py``) and
owns their lifecycle: :meth:`Engine.start` starts the writer and reader threads, the
timer, the watchdog and, on a shared store, the reading of other nodes' limits;
:meth:`Engine.stop` stops them in the order that lets queued work commit, then
closes the store.
"""

from __future__ import annotations

import asyncio
import threading

from troth.engine.batches import LoopBatches
from troth.engine.commits import Commits
from troth.engine.limits import Limits
from troth.engine.probing import Probing
from troth.engine.requests import Requests
from troth.engine.timer import Timer
from troth.engine.watchdog import Watchdog
from troth.engine.writer import READ_THREADS, Writer
from troth.flow.changes import read_limits
from troth.waiting import cancel_and_wait


class Engine(Requests, LoopBatches, Writer, Commits, Watchdog, Probing, Timer, Limits):
    """Owns the store's writer thread and the timer task."""

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
