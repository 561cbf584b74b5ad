"""Speaking to a troth (or any Resonate) server as a remote client does: ``POST /``.

The client commands use nothing else of troth than the protocol's envelope: they
work against any server of the protocol, over the network, with a token.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from typing import Any, Final

import httpx

from troth import PROTOCOL_VERSION

DEFAULT_SERVER: Final = "http://127.0.0.1:8001"
_corr = itertools.count(1)


class RemoteError(Exception):
    """The server refused the request (its status and message)."""

    def __init__(self, kind: str, status: int, message: str) -> None:
        super().__init__(f"{kind}: {status} {message}")
        self.kind = kind
        self.status = status
        self.message = message


class Unreachable(Exception):
    """No answer from the server (refused, timed out, not the protocol)."""


@dataclass
class Remote:
    """One server: its URL and the token sent with every request (``head.auth`` and
    ``Authorization: Bearer``, as the SDKs send it)."""

    server: str = DEFAULT_SERVER
    token: str | None = None
    timeout: float = 30.0
    #: A client whose connections are kept and reused (many requests in a row, as a
    #: bulk settle sends); None: a connection per request.
    http: httpx.Client | None = None

    def call(self, kind: str, data: dict[str, Any]) -> tuple[int, Any]:
        """``(status, data)`` of one request; raises :class:`Unreachable`."""
        corr = f"cli-{os.getpid()}-{time.time_ns() // 1_000_000}-{next(_corr)}"
        head: dict[str, Any] = {"corrId": corr, "version": PROTOCOL_VERSION}
        headers = {}
        if self.token:
            head["auth"] = self.token
            headers["Authorization"] = f"Bearer {self.token}"
        url = self.server.rstrip("/") + "/"
        envelope = {"kind": kind, "head": head, "data": data}
        try:
            post = httpx.post if self.http is None else self.http.post
            response = post(url, json=envelope, headers=headers, timeout=self.timeout)
            body = response.json()
            status = int(body["head"]["status"])
            return status, body.get("data")
        except httpx.HTTPError as exc:
            raise Unreachable(f"{self.server} did not answer: {exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise Unreachable(f"{self.server} did not answer with a protocol envelope") from exc

    def ok(self, kind: str, data: dict[str, Any]) -> Any:
        """The ``data`` of a 2xx/300 answer; raises :class:`RemoteError` otherwise."""
        status, body = self.call(kind, data)
        if status >= 400:
            message = body if isinstance(body, str) else str(body)
            raise RemoteError(kind, status, message)
        return body

    def operator(self, path: str, params: dict[str, str]) -> Any:
        """``GET /ops/<path>`` (troth's operator API, server/operator/api.py): its JSON;
        raises :class:`RemoteError` on a refusal, :class:`Unreachable` without one."""
        return self._ops("GET", path, params=params)

    def action(self, path: str, body: dict[str, Any], timeout: float | None = None) -> Any:
        """``POST /ops/<path>`` (troth's operator actions, server/operator/actions.py): its
        JSON, as :meth:`operator`."""
        return self._ops("POST", path, json=body, timeout=timeout)

    def _ops(self, method: str, path: str, timeout: float | None = None, **kw: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        url = self.server.rstrip("/") + "/ops/" + path
        try:
            response = httpx.request(
                method, url, headers=headers, timeout=timeout or self.timeout, **kw
            )
        except httpx.HTTPError as exc:
            raise Unreachable(f"{self.server} did not answer: {exc}") from exc
        try:
            body = response.json()
        except ValueError as exc:
            raise Unreachable(f"{self.server} did not answer /ops/{path} with JSON") from exc
        if response.status_code != 200:
            message = body.get("error") if isinstance(body, dict) else None
            if response.status_code == 404 and message is None:
                message = "no operator API here (is this a troth server?)"
            raise RemoteError(f"ops/{path}", response.status_code, str(message or body))
        return body
