"""What the engine queues, and how an outcome gets back to whoever waits for it.

Every way into the engine — a request, a timer pass, exclusive work such as a
snapshot — becomes one :class:`Work`; the writer's and the readers' queues hold
them, a batch drains them (:func:`drain`, at most :data:`MAX_BATCH`), and each one's
outcome is handed back on the event loop through its ``done`` callback
(:func:`deliver`), once only (:func:`once`): by its batch, or by its deadline when
the store does not answer in time (``engine/watchdog.py``).  These are plain values
and functions, shared by every part of the engine, so that no part imports another
to learn the shape of a job.
"""

from __future__ import annotations

import asyncio
import logging
import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from troth.store.base import Job, Outcome, Overlay

log = logging.getLogger("troth.engine")

#: Most jobs one transaction takes.
MAX_BATCH = 256

#: What runs in a traced request's job after the machine (``Engine.submit``).
Traced = Callable[[Overlay], None]


@dataclass
class Work:
    job: Job[Any] | None
    exclusive: Callable[[], Any] | None
    #: Called with the outcome, on the event loop (:func:`deliver`).
    done: Done
    loop: asyncio.AbstractEventLoop
    #: A job's outcome was given (on the event loop): by its batch or its deadline.
    answered: bool = False
    #: When it was queued (``time.monotonic``): its deadline counts from here.
    queued: float = 0.0
    #: Exclusive work run on the event loop rather than lent (``Engine.exclusive``).
    here: bool = False
    #: Exclusive work that may instead run inside the next request batch's open
    #: transaction, under a savepoint (``Engine.exclusive``'s ``inside``).
    inside: Callable[[], Any] | None = None


#: What takes a job's outcome, on the event loop: a future's setter, or a request's
#: own callback (``App.answer_soon``: no future, no extra pass of the loop).
Done = Callable[[Outcome[Any]], None]
#: What the writer's queue holds: a job or exclusive work (a store without
#: ``loop_batches``), something lent by the event loop (with it), or the stop mark.
Item = Work | Callable[[], None] | None


def drain(
    waiting: queue.SimpleQueue[Item] | queue.SimpleQueue[Work | None], works: list[Work]
) -> tuple[Work | Callable[[], None] | None, bool]:
    """Move the jobs waiting in ``waiting`` to ``works`` (up to :data:`MAX_BATCH`),
    without blocking; stop at an exclusive item (returned: it runs between batches)
    or at the stop mark (``True``)."""
    while len(works) < MAX_BATCH:
        try:
            nxt = waiting.get_nowait()
        except queue.Empty:
            return None, False
        if nxt is None:
            return None, True
        if not isinstance(nxt, Work) or nxt.exclusive is not None:
            return nxt, False
        works.append(nxt)
    return None, False


def deliver(results: list[tuple[Done, Outcome[Any]]]) -> None:
    for done, outcome in results:
        try:
            done(outcome)
        except Exception:  # one request's callback must not keep the others unanswered
            log.exception("answering a job's outcome failed")


def once(work: Work, done: Done, outcome: Outcome[Any]) -> None:
    """``done`` with the first outcome of ``work`` (its batch's, or its deadline's)."""
    if not work.answered:
        work.answered = True
        done(outcome)


def resolve(fut: asyncio.Future[Outcome[Any]], outcome: Outcome[Any]) -> None:
    if not fut.done():  # its awaiter may have been cancelled
        fut.set_result(outcome)
