"""HTTP push: POST the message JSON to an ``http(s)://`` address.

2xx is ``Completed``; 408, 429, 5xx and a refused connection are ``Retryable`` (the
remote did not take it); other 4xx are ``Permanent``; a failure after the request
was sent is ``Unknown``.  The row's idempotency key travels as ``Idempotency-Key``
so a remote that deduplicates can.

Outbound auth (docs/security.md): a receiving endpoint that runs code on an
``execute`` must know the POST came from troth, so troth can send a bearer token —
one for a destination (``push_tokens``, by ``host:port`` then ``host``) or one for
all (``push_token``).  Tokens are never logged; a token sent in clear text (plain
``http://`` to a host other than this machine) is warned about once per host.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import httpx

from troth.outbox import codes
from troth.outbox.rows import OutboxRow
from troth.outbox.types import Completed, Dispatched, Permanent, Retryable, Unknown
from troth.transport.messages import message_body

log = logging.getLogger("troth.push")

#: Addresses whose token choice is remembered; one entry per distinct address.
TOKEN_CACHE_SIZE = 4096


def classify(status: int) -> Dispatched:
    if 200 <= status < 300:
        return Completed()
    if status in (408, 429) or status >= 500:
        return Retryable(f"{codes.HTTP_STATUS}{status}")
    return Permanent(f"{codes.HTTP_STATUS}{status}")


class PushTokens:
    """Which bearer token (if any) goes to which destination.

    ``per_host`` keys are ``host`` or ``host:port``, lower-case; the most specific
    match wins, then ``default``.  The choice is made once per address (the
    outbox sends the same few addresses over and over) and remembered."""

    def __init__(self, default: str = "", per_host: Mapping[str, str] | None = None) -> None:
        self.default = default
        self.per_host = {k.lower(): v for k, v in (per_host or {}).items()}
        self.chosen: dict[str, str | None] = {}
        self.warned: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self.default or self.per_host)

    def for_address(self, address: str) -> str | None:
        token = self.chosen.get(address, "")
        if token != "":
            return token
        token = self.choose(address)
        if len(self.chosen) >= TOKEN_CACHE_SIZE:
            self.chosen.clear()
        self.chosen[address] = token
        return token

    def choose(self, address: str) -> str | None:
        try:
            parts = urlsplit(address)
            host = (parts.hostname or "").lower()
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return None  # the send itself fails on such an address
        token = self.per_host.get(f"{host}:{port}") or self.per_host.get(host) or self.default
        if not token:
            return None
        if parts.scheme == "http" and not _local(host) and host not in self.warned:
            self.warned.add(host)
            log.warning(
                "a push token goes to %s over plain http: anyone on the path can read it; "
                "use an https:// address",
                host,
            )
        return token


def _local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HttpSender:
    """Pushes rows to HTTP endpoints with one shared connection pool."""

    def __init__(
        self,
        server_url: str,
        *,
        connect_timeout: float = 10.0,
        tokens: PushTokens | None = None,
        propagate: Callable[[dict[str, str]], None] | None = None,
    ) -> None:
        self.server_url = server_url
        self.tokens = tokens if tokens else None
        #: Adds trace context to a push's headers when tracing is on (server/tracing.py).
        self.propagate = propagate
        # No read timeout here: the dispatcher's send_timeout turns a hang into Unknown.
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=connect_timeout),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )

    async def send(self, row: OutboxRow) -> Dispatched:
        body = message_body(row.message, self.server_url)
        headers = {"content-type": "application/json", "idempotency-key": row.key}
        if self.tokens is not None and (token := self.tokens.for_address(row.address)):
            headers["authorization"] = f"Bearer {token}"
        if self.propagate is not None:
            self.propagate(headers)
        try:
            response = await self.client.post(row.address, content=body, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            return Retryable(codes.HTTP_REFUSED)
        except httpx.HTTPError:
            return Unknown(codes.HTTP_ERROR)
        return classify(response.status_code)

    async def close(self) -> None:
        await self.client.aclose()
