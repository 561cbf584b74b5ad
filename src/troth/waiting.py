"""Waiting on an event with a timeout, without ``asyncio.wait_for``.

On Python 3.11, ``wait_for`` can swallow a cancellation that arrives while the inner
awaitable completes (CPython gh-86296): a loop built on it may then never stop.  The
engine's timer and the delivery loop are cancelled on shutdown, so they wait with
``asyncio.wait``, which always lets a cancellation through.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds passed; True if it was set."""
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
    finally:
        waiter.cancel()
    return bool(done)


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel a loop's task and wait until it has stopped (shutdown)."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
