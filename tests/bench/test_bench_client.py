"""The bench's protocol client against what a server does to idle connections.

A client the bench opens early (the spare one, for the census) may sit without a
request past ``header_timeout``; the server then answers ``408`` (``kind``
``unknown``) and closes.  When the client's loop has not yet seen the close, that
408 is what its next request reads: the request was never read by the server, so
the client sends it again on a new connection instead of failing the run.
"""

from __future__ import annotations

import asyncio
import time

from helpers.support import running_server
from troth.server.config import Settings
from troth_bench.client import Client


def test_a_request_on_a_connection_cut_off_before_it_is_sent_again() -> None:
    settings = Settings(store="memory", header_timeout=0.5, access_log=False)
    with running_server(settings) as server:

        async def scenario() -> tuple[int, int]:
            client = await Client.open("127.0.0.1", server.settings.port, "spare")
            # Blocking, so this loop does not see the close: the 408 stays unread.
            time.sleep(1.5)
            status, _, _ = await client.call("promise.get", {"id": "nowhere"})
            client.close()
            return status, client.reconnects

        status, reconnects = asyncio.run(scenario())
    assert status == 404  # the request's own answer, not the connection's 408
    assert reconnects == 1
