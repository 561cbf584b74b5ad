"""ASGI's types and the few ways troth answers over it: a JSON body, a refusal, a
request body read within a limit.

Shared by the routes (``server/http/app.py``), the SSE streams (``server/http/sse.py``) and the
httptools path (``server/http/direct.py``), which must write the very same heads.
"""

from __future__ import annotations

import msgspec

from troth.asgi_types import Receive, Scope, Send
from troth.server.ingress.auth import Denied

JSON = [(b"content-type", b"application/json")]
#: What a 503 answer to an envelope adds: the store refuses writes for now (full,
#: read-only, out of reach); the request may be sent again (docs/protocol.md).
RETRY_AFTER = [(b"retry-after", b"1")]
_json = msgspec.json.Encoder()


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    """The client disconnected (or was cut off as too slow) before its body arrived."""


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole request body, refusing (413) past ``limit`` without buffering it all."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                if int(value) > limit:
                    raise BodyTooLarge
            except ValueError:
                pass
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def json_headers(body: bytes, status: int = 200) -> list[tuple[bytes, bytes]]:
    """The headers of a JSON answer carrying ``body`` (an envelope's 503 says when to
    try again)."""
    length = (b"content-length", b"%d" % len(body))
    # Content-Length last: JsonHeads (server/http/direct.py) cuts a head there.
    return [*JSON, *RETRY_AFTER, length] if status == 503 else [*JSON, length]


async def send_bytes(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = json_headers(body)
    if extra:
        headers += extra
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def respond(send: Send, status: int, obj: object) -> None:
    await send_bytes(send, status, _json.encode(obj))


async def refuse(send: Send, denied: Denied) -> None:
    """A 401 or 403 outside the envelope (``/poll``, operator paths)."""
    extra = [(b"www-authenticate", b"Bearer")] if denied.status == 401 else None
    await send_bytes(send, denied.status, _json.encode({"error": denied.message}), extra)
