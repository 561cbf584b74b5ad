"""The debug surface (only with ``--debug``): ``debug.start`` pauses the timer and
delivery, ``debug.stop`` resumes them, ``debug.tick`` fires what is due at a given
time, ``debug.reset`` empties the store, ``debug.snap`` returns all of it.

Requests like any other in their envelope (``server/ingress/envelope.py`` admits them only
when debug is on), but served beside the engine's group commit, not through it.
"""

from __future__ import annotations

from troth.engine import Engine
from troth.machine.state import Response
from troth.protocol import requests as rq
from troth.server.delivery.bounces import BounceTracker


async def debug(
    engine: Engine, bounces: BounceTracker, kind: str, req: rq.Req, debug_time: int | None
) -> Response:
    """Serve one ``debug.*`` request (``debug_time``: its head's
    ``resonate:debug_time``)."""
    if isinstance(req, rq.DebugTick):
        if debug_time is not None and debug_time != req.time:
            return Response(400, "debug.tick time must equal head resonate:debug_time")
        fired = await engine.tick(req.time)
        return Response(200, {"fired": fired})
    if kind == "debug.start":
        engine.pause()
    elif kind == "debug.stop":
        engine.resume()
    elif kind == "debug.reset":
        await engine.exclusive(engine.store.reset)
        engine.flow.load([])  # a reset store has no limits
        bounces.clear()
    elif kind == "debug.snap":
        return Response(200, await engine.exclusive(engine.store.snapshot))
    return Response(200, {})
