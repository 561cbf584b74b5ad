"""What follows every batch, committed or failed: the one after-commit path.

Whichever thread ran the batch (the writer, or the event loop for a batch alone),
:meth:`Commits._answer` counts it, tells store health what it met (a batch refused
whole for a fault of the store starts an episode; one that wrote ends it), answers
its jobs on the event loop, wakes the timer (and, through ``on_deadline``, the other
nodes) for a deadline earlier than the one it sleeps until, and runs ``on_commit``
(metrics; delivery claims the messages just written) before the next batch starts.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from troth.engine.base import Commit, EngineBase
from troth.engine.work import Work, deliver
from troth.store.base import Outcome

log = logging.getLogger("troth.engine")


class Commits(EngineBase):
    """Answers a batch and runs the hooks that follow a commit."""

    def _answer(
        self,
        works: list[Work],
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
            deliver(results)
        else:
            loop.call_soon_threadsafe(deliver, results)
        if earliest < self._target or (self._reading and earliest < math.inf):
            # Earlier than the timer's target, or the timer may be reading the next
            # deadline from before this commit (_poke notes it).
            loop.call_soon_threadsafe(self._poke, earliest)
        if earliest < self._target and self.on_deadline is not None:
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
