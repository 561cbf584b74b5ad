"""Whether this node's store takes writes: what ``/ready`` and the metrics say.

The engine tells it what every batch met: a batch refused whole for a fault of the
store (``store/faults.py``: the disk is full, the database read-only or out of
reach) starts an *episode*; a batch that committed writes, or the probe the engine
commits while an episode lasts (``Engine.probe``), ends it.  An episode is logged
twice, when it starts and when it ends, however many batches it refuses; meanwhile
``/ready`` answers 503 with its reason, ``troth_store_writable`` reads 0, and
``troth_store_write_errors_total{reason}`` counts the refused commits.

Thread-safe: the engine reports from its writer thread and from the event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from troth.store.faults import StoreFault

log = logging.getLogger("troth.store.health")

#: Counter of commits the store refused (batches, timer passes, probes, delivery and
#: retention writes), by reason.
WRITE_ERRORS = "troth_store_write_errors_total"
#: Gauge: 1 while the store takes writes, 0 during an episode.
WRITABLE = "troth_store_writable"


class StoreHealth:
    """The store's write health, as the engine's commits found it."""

    def __init__(
        self,
        count: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: Called with the reason of each refused commit (the metric's counter).
        self.count = count
        self.clock = clock
        self.lock = threading.Lock()
        #: The fault of the episode under way; None while writes commit.
        self.fault: StoreFault | None = None
        #: When the episode began (``clock``).
        self.since = 0.0
        #: Commits refused in this episode, and ever (the probe compares the latter).
        self.refused = 0
        self.refusals = 0
        #: When a batch last committed (``clock``; the engine sets it): ``/ready``
        #: probes a store that has been quiet for a while, and pings a busy one.
        self.last_write = clock()

    def failed(self, fault: StoreFault) -> bool:
        """A commit was refused for ``fault``; True if that began an episode."""
        with self.lock:
            self.refusals += 1
            began = self.fault is None
            changed = not began and self.fault is not None and self.fault.reason != fault.reason
            if began:
                self.since = self.clock()
                self.refused = 0
            self.refused += 1
            self.fault = fault
        if self.count is not None:
            self.count(fault.reason)
        if began:
            log.warning(
                "store refuses writes (%s): %s; answering 503 and /ready 503 until it "
                "takes writes again",
                fault.reason,
                fault.detail or fault,
            )
        elif changed:
            log.warning("store still refuses writes, now %s: %s", fault.reason, fault.detail)
        return began

    def committed(self) -> StoreFault | None:
        """A write committed: the episode under way, if any, ends (and is returned)."""
        now = self.clock()
        with self.lock:
            self.last_write = now
            ended, self.fault = self.fault, None
            refused = self.refused
            since = self.since
        if ended is not None:
            log.warning(
                "store takes writes again after %.1f s (%s; %d commits refused)",
                now - since,
                ended.reason,
                refused,
            )
        return ended

    def quiet_for(self) -> float:
        """Seconds since a write last committed (or the node started)."""
        return self.clock() - self.last_write

    def answer(self) -> dict[str, object]:
        """What ``/ready`` says of the episode under way (call only during one)."""
        fault = self.fault
        assert fault is not None
        return {
            "status": "unavailable",
            "reason": fault.reason,
            "error": str(fault),
            "seconds": round(self.clock() - self.since, 1),
        }
