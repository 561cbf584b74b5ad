"""The bare HTTP round trip: an empty ``POST`` answered by troth's own server stack.

uvicorn with uvloop and httptools, raw ASGI, a fixed small JSON answer: exactly
what ``troth serve`` runs (``server/run.py``) minus troth.  Its requests/s and
latency are the ceiling no troth request can pass on this machine with this
generator, so the bench prints troth's figures as ratios to it.

Run as ``python -m troth_bench.bare PORT``.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]

BODY = b'{"kind":"bare","head":{"corrId":"0","status":200,"version":"2026-04-01"},"data":{}}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def app(
    scope: MutableMapping[str, Any],
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    """Read the whole body (as troth does), answer 200 with a fixed envelope."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False) and message["type"] == "http.request"
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    args = sys.argv[1:] if argv is None else argv
    port = int(args[0])
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
    )
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
