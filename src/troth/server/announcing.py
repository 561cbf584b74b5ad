"""uvicorn's server, saying "listening" only once it is.

uvicorn logs its own line when it binds; troth binds the sockets itself before the
store is opened (``server/startup.py``) and hands them over, so the line that tells
an operator the server is up has to come from here: after the app's startup
completed and the sockets accept connections.  It is the stopping server
(``server/stopping.py``) too, so that a stop ends the SSE streams at once.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import uvicorn

from troth.server.stopping import Server


class AnnouncingServer(Server):
    """Calls ``announce`` once, when the server has started serving."""

    def __init__(
        self, config: uvicorn.Config, closing: asyncio.Event, announce: Callable[[], None]
    ) -> None:
        super().__init__(config, closing)
        self.announce = announce

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.announce()
