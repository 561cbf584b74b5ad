"""The dashboard at ``GET /ui``: three static files and nothing else on the server.

The page is plain HTML with a little vanilla JavaScript (``static/``, shipped as
package data: no build step, nothing from a CDN, works offline).  Everything it
shows it reads in the browser from the same routes any operator tool uses —
``GET /ops/…``, ``GET /metrics`` and the protocol's ``POST /`` — so each of its
data requests is checked by the same auth as a script's, and each action it takes
is an ordinary request, authorised like a client's: settling a promise or deleting a
schedule through the protocol, cancelling a workflow or retrying failed deliveries
through ``POST /ops/…`` as ``troth cancel`` and ``troth outbox retry`` do.  The
files themselves hold no data, so they are served without a token; the page asks
for one when a data request answers 401.

The files are read once when the app is built and answered from memory: serving
the dashboard costs the request path nothing but one more ``elif`` after ``POST /``.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Final

from troth.asgi_types import Send

#: Path under ``/ui/`` → (file in ``static/``, content type).
FILES: Final = {
    "": ("index.html", b"text/html; charset=utf-8"),
    "app.js": ("app.js", b"text/javascript; charset=utf-8"),
    "app.css": ("app.css", b"text/css; charset=utf-8"),
}

#: The page runs only its own script and talks only to its own origin; data is put
#: into the page with ``textContent``, never as HTML, and the CSP makes an injected
#: ``<script>`` inert as a second line — the token in sessionStorage is worth that.
SECURITY_HEADERS: Final = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
]


class Dashboard:
    """The dashboard's files, loaded once, answered from memory."""

    def __init__(self) -> None:
        root = files("troth.ui") / "static"
        self.files: dict[str, tuple[bytes, bytes]] = {
            route: ((root / name).read_bytes(), ctype) for route, (name, ctype) in FILES.items()
        }

    @staticmethod
    def matches(path: str) -> bool:
        return path == "/ui" or path.startswith("/ui/")

    async def __call__(self, path: str, method: str, send: Send) -> None:
        """``GET /ui`` redirects to ``/ui/`` (so relative URLs resolve); ``/ui/`` is the
        page, whose views are hash routes (``/ui/#/workflow/ID``) that need no route
        here."""
        if method not in ("GET", "HEAD"):
            await _plain(send, 405, b"use GET", [(b"allow", b"GET, HEAD")])
            return
        if path == "/ui":
            await _plain(send, 308, b"", [(b"location", b"/ui/")])
            return
        found = self.files.get(path[len("/ui/") :])
        if found is None:
            await _plain(send, 404, b"no such file; the dashboard is at /ui/", [])
            return
        body, ctype = found
        headers = [
            (b"content-type", ctype),
            (b"content-length", str(len(body)).encode()),
            *SECURITY_HEADERS,
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body if method == "GET" else b""})


async def _plain(send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]]) -> None:
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
