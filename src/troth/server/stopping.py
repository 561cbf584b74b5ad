"""uvicorn's server, told to end troth's SSE streams the moment a stop is asked for.

On SIGTERM or SIGINT uvicorn stops accepting, then waits up to
``timeout_graceful_shutdown`` (10 s) for every open connection to finish before the
app's lifespan shutdown runs — and only that shutdown told the SSE streams to end.
A stream never finishes by itself, so one connected worker held every stop for the
whole 10 s, ended it with a cancellation traceback, and outlasted the 10 s a
container runtime grants before SIGKILL.  Told at the signal, each stream ends at
once (its worker reconnects, to another node behind a balancer), and the stop takes
what the requests in flight take.
"""

from __future__ import annotations

import asyncio
import socket
from types import FrameType

import uvicorn


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, closing: asyncio.Event) -> None:
        super().__init__(config)
        self.closing = closing  # the app's: set, every SSE stream ends (PollStreams.poll)
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The signal handler (on the loop's thread, between two steps of it): the
        event is set by the loop itself, never from inside whatever it interrupted."""
        super().handle_exit(sig, frame)
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.closing.set)
