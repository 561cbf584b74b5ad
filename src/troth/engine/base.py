"""What the engine holds, and what each of its parts offers the others.

The engine is one object, :class:`troth.engine.core.Engine`, assembled from one
class per concern, each in a module of its own: the request API
(``requests.py``), batches on the event loop (``batches.py``), the writer and
reader threads (``writer.py``), what follows a batch (``commits.py``), the
watchdog (``watchdog.py``), health probing (``probing.py``), the timer
(``timer.py``) and flow control (``limits.py``).  They share one state — a job
queued by a request is drained by the writer thread, expired by the watchdog and
answered after its commit — so the state lives here, in one constructor, and each
part is a class over it rather than an object holding references to the others:
a request's path makes its calls on one object, with no hop from object to object.

What one part calls in another is declared here as an abstract method (its body is
in the module named beside it), so that each part type-checks on its own and an
engine that lacks one cannot be built.
"""

from __future__ import annotations

import asyncio
import collections
import math
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from troth.engine.clock import ClockWatch
from troth.engine.health import StoreHealth
from troth.engine.work import Done, Item, Work
from troth.flow.gate import Flow
from troth.machine.internal import Config
from troth.outbox.rows import OutboxRow
from troth.store.base import BatchClaim, Outcome, Overlay, Store
from troth.store.faults import StoreFault

T = TypeVar("T")

#: Seconds a job (a request, a timer pass) waits for its batch's outcome before it
#: is answered without it (``Engine._expire``, ``engine/watchdog.py``): a database
#: that stopped answering must not hold requests longer (docs/operations.md, "When a
#: node is cut off from its database").  The default of ``Engine.deadline``.
DEADLINE = 5.0


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Commit:
    """What one committed batch did: its jobs, the outbox messages they wrote, and the
    due rows it claimed before its COMMIT (``Store.take_claimed``; None: none)."""

    jobs: int
    messages: int
    claimed: list[OutboxRow] | None = None


@dataclass
class EngineStats:
    batches: int = 0
    jobs: int = 0
    ticks: int = 0
    fired: int = 0
    largest_batch: int = 0
    #: How late (ms) the last timer pass that fired ran after its earliest deadline.
    lag_ms: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class EngineBase(ABC):
    """The engine's state (one constructor for all its parts) and the calls its parts
    make to one another."""

    def __init__(
        self,
        store: Store,
        config: Config,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        on_commit: Callable[[Commit], None] | None = None,
        claim_in_batch: Callable[[], BatchClaim | None] | None = None,
        on_resume: Callable[[], None] | None = None,
        on_timer: Callable[[int, int, float], None] | None = None,
        on_refused: Callable[[str], None] | None = None,
        on_clock_jump: Callable[[int], None] | None = None,
        lone_commit_here: bool = True,
        deadline: float = DEADLINE,
    ) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        #: Runs on the writer thread right after every commit, before the next batch
        #: starts (metrics; delivery claims the messages written there: no queue wait).
        self.on_commit = on_commit
        #: Asked on the writer thread, by a batch that wrote outbox messages, what to
        #: claim before its COMMIT (delivery: ``DeliveryLoop.batch_claim``); handed to
        #: every ``Store.execute``, and only a store that claims in its batches asks.
        self.claim_in_batch = claim_in_batch
        #: Runs when ``debug.start`` resumes the engine (delivery sweeps again).
        self.on_resume = on_resume
        #: Told of each timer pass that fired: ``(lag_ms, fired, seconds)`` (tracing).
        self.on_timer = on_timer
        #: Runs on the writer thread after a commit that armed a deadline earlier than
        #: the one the timer sleeps until: the cluster tells the other nodes.  Not a
        #: constructor argument: the cluster attaches it while this node is a member
        #: (``server/delivery/cluster.py``, ``Cluster.start`` and ``stop``).
        self.on_deadline: Callable[[int], None] | None = None
        self.stats = EngineStats()
        #: The limits of worker groups, kept by every job that writes (``troth/flow``).
        self.flow = Flow()
        #: Whether the store takes writes (``engine/health.py``): ``/ready``, metrics;
        #: ``on_refused`` is told the reason of each commit the store refused.
        self.health = StoreHealth(on_refused)
        #: Steps of the wall clock, as the timer notices them (``engine/clock.py``);
        #: ``on_clock_jump`` is told each step (ms).
        self.clock_watch = ClockWatch(clock, on_jump=on_clock_jump)
        self.paused = False
        #: A batch alone commits on the event loop (``lone_commit = loop``,
        #: :meth:`_commit`), not on the writer thread.
        self.lone_commit_here = lone_commit_here
        self._queue: queue.SimpleQueue[Item] = queue.SimpleQueue()
        #: ``loop_batches``: work waiting on the event loop; whether a run of
        #: :meth:`_kick` is scheduled; whether the connection is lent to the writer
        #: thread (a COMMIT or exclusive work in progress there).
        self._pending: collections.deque[Work] = collections.deque()
        self._kicked = False
        self._lent = False
        self._thread: threading.Thread | None = None
        self._reads: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
        self._readers: list[threading.Thread] = []
        self._timer: asyncio.Task[None] | None = None
        #: Reads the limits other nodes set (a store shared between nodes).
        self._limits: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._target = math.inf  # the instant the timer sleeps until
        self._reading = False  # the timer is between reading and setting _target
        self._noted = math.inf  # the earliest deadline committed meanwhile (timer.py)
        self._floor = -math.inf  # the lowest deadline the next read must see (timer.py)
        self._full_at = -math.inf  # when a read last looked from the bottom (monotonic)
        #: Probes the store while it refuses writes (``_probing``); None otherwise.
        self._prober: asyncio.Task[None] | None = None
        self._tidying: asyncio.Future[None] | None = None
        #: Seconds a job may wait for its outcome (:data:`DEADLINE`; 0: for ever).
        self.deadline = deadline
        #: Jobs queued and not yet taken into a batch, by ``id``: whoever pops one
        #: first — the thread that starts its batch, or :meth:`_expire` — owns it.
        self._unstarted: dict[int, Work] = {}
        #: Batches under way (their jobs), by the ``id`` of their list.  Only what is
        #: queued or running is held, never a record per job answered: jobs kept
        #: alive a quarter second longer at ten thousand a second outlive the young
        #: GC generations and made old-generation collections stall the loop
        #: (measured: p99 three times longer).
        self._running: dict[int, list[Work]] = {}
        self._watchdog: asyncio.Task[None] | None = None
        #: When the writer last finished a batch (not refused by a fault of the store)
        #: or exclusive work that did not fail (``time.monotonic``, the loop's clock;
        #: written by whichever thread finished it): :meth:`_expire` tells a store
        #: that does not answer from a node that is behind.
        self._progress = time.monotonic()

    # -- the request API (requests.py) -----------------------------------------------

    @abstractmethod
    async def outcome(
        self,
        fn: Callable[[Overlay], T],
        now: int,
        keys: tuple[str, ...] = (),
        *,
        read_only: bool = False,
        settles: tuple[str, ...] = (),
    ) -> Outcome[T]: ...

    @abstractmethod
    async def run(
        self,
        fn: Callable[[Overlay], T],
        now: int,
        keys: tuple[str, ...] = (),
        *,
        read_only: bool = False,
        settles: tuple[str, ...] = (),
    ) -> T: ...

    @abstractmethod
    async def exclusive(
        self, fn: Callable[[], T], *, here: bool = False, inside: Callable[[], T] | None = None
    ) -> T: ...

    # -- batches on the event loop (batches.py) ----------------------------------------

    @abstractmethod
    def _submit(self, work: Work) -> None: ...

    @abstractmethod
    def _resubmit(self, works: list[Work]) -> None: ...

    @abstractmethod
    def _returned(self, results: list[tuple[Done, Outcome[Any]]]) -> None: ...

    # -- the writer thread (writer.py) and what follows a batch (commits.py) ----------

    @abstractmethod
    def _run_exclusive(self, work: Work) -> None: ...

    @abstractmethod
    def _run_batch(self, works: list[Work]) -> None: ...

    @abstractmethod
    def _answer(
        self,
        works: list[Work],
        outcomes: list[Outcome[Any]],
        *,
        returned: bool,
        here: bool = False,
    ) -> None: ...

    # -- store health (probing.py) ---------------------------------------------------

    @abstractmethod
    def refused(self, fault: StoreFault) -> None: ...

    @abstractmethod
    def _writable(self) -> None: ...

    @abstractmethod
    def _log_failed(self, exc: BaseException, message: str, n: int) -> None: ...

    # -- the timer (timer.py) and flow control (limits.py) ----------------------------

    @abstractmethod
    def _poke(self, instant: float) -> None: ...

    @abstractmethod
    def _tick(self, tx: Overlay, now: int) -> int: ...

    @abstractmethod
    def keep_limits(self, tx: Overlay, now: int) -> None: ...
