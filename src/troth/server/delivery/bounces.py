"""Tasks that keep bouncing, and the backoff of their next ``execute`` (docs/protocol.md,
"Tasks that keep bouncing back off").

A task *bounces* when a worker takes it and gives it back without progress: a
``task.release`` answered 200 (a worker that lacks the function, one that throws on
replay, an SDK and troth disagreeing about a suspend).  The specification's release
sets the task's retry time to now, so r6 re-emits ``execute`` in the same commit and
the same worker takes it again at once: thousands of cycles a minute.  The machine
stays as the specification says; what the server may choose is *when the outbox
row is delivered* (delivery timing is the server's), so a task that bounced
``threshold`` times in a row without progress gets its next ``execute`` row held back
by a capped exponential delay (``base_ms * 2**k``, at most ``cap_ms``, which the
server sets to ``retry_timeout`` so the row is never held past r6's next emission).

Progress (a ``task.suspend`` or ``task.fulfill`` answered without refusal) forgets
the task.  A bounce that comes more than ``window_ms`` after the task was last
re-offered (its previous bounce plus the delay then applied) starts a new episode.

Process-local, per node, bounded (least recently touched tasks are forgotten past
``capacity``), and touched only on the event loop after an answer is known: nothing
here is needed for correctness, a lost entry only means a task re-offered at once.
Reads (:meth:`BounceTracker.delay`) do not change it, so a job that computes a delay
from it gives the same answer if its batch re-runs.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

from troth.protocol.address import parse_poll

log = logging.getLogger("troth.bounces")

#: Bounces in one episode before the next ``execute`` is held back.
THRESHOLD = 3
#: Delay of the first held-back ``execute`` (ms); it doubles with each bounce after.
BASE_MS = 50
#: How long after its re-offer a bounce still belongs to the same episode (ms).
WINDOW_MS = 10_000
#: Most tasks remembered at once.
CAPACITY = 10_000


@dataclass(frozen=True)
class Refusal:
    """The last request of a task's worker that troth refused (4xx)."""

    kind: str
    status: int
    message: str
    corr_id: str

    def describe(self) -> str:
        text = self.message if len(self.message) <= 200 else self.message[:200] + "…"
        return f"{self.kind} {self.status} {text!r} corrId={self.corr_id}"


@dataclass
class Episode:
    """One task's run of bounces without progress."""

    count: int = 0
    first_at: int = 0
    last_at: int = 0
    #: When the execute written by the last bounce became claimable.
    due_at: int = 0
    #: The group its execute went to (``poll://…@group/…``), when known.
    group: str | None = None
    refusal: Refusal | None = None
    warned: bool = False


@dataclass(frozen=True)
class Hold:
    """The backoff for a task's next ``execute``: delay it by ``delay_ms``, it being the
    ``count``-th bounce of its episode (counting the one being answered)."""

    delay_ms: int
    count: int


class BounceTracker:
    def __init__(
        self,
        cap_ms: int,
        *,
        threshold: int = THRESHOLD,
        base_ms: int = BASE_MS,
        window_ms: int = WINDOW_MS,
        capacity: int = CAPACITY,
    ) -> None:
        self.cap_ms = cap_ms
        self.threshold = threshold
        self.base_ms = base_ms
        self.window_ms = window_ms
        self.capacity = capacity
        self.tasks: OrderedDict[str, Episode] = OrderedDict()
        #: Since start: bounces counted, and ``execute`` rows held back.
        self.bounces = 0
        self.backoffs = 0

    def _live(self, task: str, now: int) -> Episode | None:
        """The task's episode, unless it ended (the last re-offer is past the window)."""
        e = self.tasks.get(task)
        if e is None:
            return None
        if now - max(e.last_at, e.due_at) > self.window_ms or now < e.last_at:
            return None  # ended; (now < last_at: the debug clock went back)
        return e

    # -- reads (a job may call these: they change nothing) ---------------------------

    def hold(self, task: str, now: int) -> Hold | None:
        """The backoff for the ``execute`` a ``task.release`` of ``task`` at ``now``
        would write, or None when it goes out at once."""
        e = self._live(task, now)
        count = 1 if e is None else e.count + 1
        if count < self.threshold:
            return None
        k = min(count - self.threshold, 40)
        return Hold(min(self.base_ms << k, self.cap_ms), count)

    def episode(self, task: str, now: int) -> Episode | None:
        """The task's live episode, if it is bouncing now (``troth explain`` quotes it)."""
        return self._live(task, now)

    def in_backoff(self, now: int) -> int:
        """Tasks whose current episode has held back an ``execute`` (the gauge)."""
        return sum(
            1
            for e in self.tasks.values()
            if e.count >= self.threshold and now - max(e.last_at, e.due_at) <= self.window_ms
        )

    # -- what the server learned (event loop, after the answer) --------------------------

    def _touch(self, task: str, now: int) -> Episode:
        e = self._live(task, now)
        if e is None:
            e = Episode(first_at=now)
            self.tasks[task] = e
        self.tasks.move_to_end(task)
        while len(self.tasks) > self.capacity:
            self.tasks.popitem(last=False)
        return e

    def bounced(self, task: str, now: int, hold: Hold | None, address: str | None) -> Episode:
        """A ``task.release`` of ``task`` was answered 200 at ``now``; ``hold`` is the
        backoff its job applied (None: its execute went out at once), ``address``
        where that execute went."""
        e = self._touch(task, now)
        e.count += 1
        e.last_at = now
        e.due_at = now + (hold.delay_ms if hold is not None else 0)
        if address is not None:
            poll = parse_poll(address)
            e.group = poll.group if poll is not None else None
        self.bounces += 1
        if hold is not None:
            self.backoffs += 1
            if not e.warned:
                e.warned = True
                log.warning(
                    "task %s bounced %d times in %.1f s without progress (group %s); "
                    "its execute is held back, up to %d ms per re-offer, until it "
                    "progresses or a worker connects; last refusal: %s",
                    task,
                    e.count,
                    (now - e.first_at) / 1000,
                    e.group or "-",
                    self.cap_ms,
                    e.refusal.describe() if e.refusal is not None else "none",
                )
        return e

    def refused(self, task: str, now: int, refusal: Refusal) -> None:
        """A ``task.suspend``/``fulfill``/``heartbeat`` of ``task`` was refused."""
        self._touch(task, now).refusal = refusal

    def progressed(self, task: str) -> None:
        """A ``task.suspend`` or ``task.fulfill`` of ``task`` succeeded: forget it."""
        self.tasks.pop(task, None)

    def expedite(self, group: str) -> list[str]:
        """A worker of ``group`` connected: the tasks of that group whose last execute
        was held back (their rows are to be made due at once, ``OutboxLifecycle.
        expedite``).  Their episodes go on (a worker that also lacks the function
        bounces them again, and the backoff resumes where it was), but from now on
        the window counts from the last bounce, not from the delay cut short."""
        found: list[str] = []
        for task, e in self.tasks.items():
            if e.group == group and e.due_at > e.last_at:
                e.due_at = e.last_at
                found.append(task)
        return found

    def clear(self) -> None:
        self.tasks.clear()
