"""CORS for browser clients (``cors_allow_origins``, docs/security.md).

A browser page on another origin — e.g. Resonate's web UI speaking the envelope —
may call ``POST /``, open ``GET /poll/…`` (a fetch-based SSE reader, since it must
send ``Authorization``) and ``GET /health`` only when troth says so:

* a preflight ``OPTIONS`` on those paths from an allowed ``Origin`` is answered 204
  with ``Access-Control-Allow-Origin``/``-Methods``/``-Headers`` (``Authorization``,
  ``Content-Type``) and ``-Max-Age``;
* the actual responses to an allowed ``Origin`` carry ``Access-Control-Allow-Origin``
  and ``Vary: Origin`` (refusals too, so the page can read why it was refused);
* any other origin gets no CORS header at all (the browser then withholds the
  answer from the page).  CORS is not access control: auth still decides.

Off by default; then the app holds None and the request path pays one
``is not None``.  On, a request without an ``Origin`` header (every SDK, every
worker) pays one scan of its headers.
"""

from __future__ import annotations

from collections.abc import Iterable

from troth.asgi_types import Message, Send

#: Seconds a browser may cache a preflight answer (Chromium caps it at 7200).
MAX_AGE = 3600
METHODS = b"GET, POST, OPTIONS"
HEADERS = b"Authorization, Content-Type"


def served(path: str) -> bool:
    """The paths browsers may call: the protocol, the SSE stream, the health check."""
    return path == "/" or path == "/health" or path.startswith("/poll/")


class Cors:
    """The allowed origins and the headers that say so."""

    def __init__(self, origins: Iterable[str]) -> None:
        self.origins = frozenset(origins)
        self.any = "*" in self.origins

    def allow(self, headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
        """The ``Access-Control-Allow-Origin`` value for this request, or None (no
        ``Origin``, or one not allowed)."""
        for name, value in headers:
            if name == b"origin":
                if self.any:
                    return b"*"
                return value if value.decode("latin-1") in self.origins else None
        return None

    def response_headers(self, origin: bytes) -> list[tuple[bytes, bytes]]:
        if origin == b"*":
            return [(b"access-control-allow-origin", b"*")]
        return [(b"access-control-allow-origin", origin), (b"vary", b"Origin")]

    async def preflight(self, send: Send, origin: bytes | None) -> None:
        """Answer an ``OPTIONS``: 204, with the CORS headers only for an allowed origin."""
        headers: list[tuple[bytes, bytes]] = [(b"content-length", b"0")]
        if origin is not None:
            headers += self.response_headers(origin)
            headers += [
                (b"access-control-allow-methods", METHODS),
                (b"access-control-allow-headers", HEADERS),
                (b"access-control-max-age", b"%d" % MAX_AGE),
            ]
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    def wrap(self, send: Send, origin: bytes) -> Send:
        """``send`` that adds the allow-origin headers to the response's start."""
        extra = self.response_headers(origin)

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        return sending
