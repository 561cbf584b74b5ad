"""ASGI's types, named once for every package that speaks ASGI.

The server's routes (``server/http/``), the dashboard (``ui/``) and the SSE
streams of the ``poll`` transport (``transport/poll.py``) all write through an ASGI
``send``.  ``transport`` may not import ``server``, so the names live here, at the
top of the package, where each can import them without an import cycle.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

#: A connection's scope: its type, path, headers, …
Scope = MutableMapping[str, Any]
#: One event received or sent: ``http.request``, ``http.response.start``, …
Message = MutableMapping[str, Any]
#: Awaits the next event from the client.
Receive = Callable[[], Awaitable[Message]]
#: Sends one event to the client.
Send = Callable[[Message], Awaitable[None]]
