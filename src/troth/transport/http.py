"""HTTP push: POST the message JSON to an ``http(s)://`` address.

2xx is ``Completed``; 408, 429, 5xx and a refused connection are ``Retryable`` (the
remote did not take it); other 4xx are ``Permanent``; a failure after the request
was sent is ``Unknown``.  The row's idempotency key travels as ``Idempotency-Key``
so a remote that deduplicates can.
"""

from __future__ import annotations

import httpx

from troth.outbox import codes
from troth.outbox.rows import OutboxRow
from troth.outbox.types import Completed, Dispatched, Permanent, Retryable, Unknown
from troth.transport.messages import message_body


def classify(status: int) -> Dispatched:
    if 200 <= status < 300:
        return Completed()
    if status in (408, 429) or status >= 500:
        return Retryable(f"{codes.HTTP_STATUS}{status}")
    return Permanent(f"{codes.HTTP_STATUS}{status}")


class HttpSender:
    """Pushes rows to HTTP endpoints with one shared connection pool."""

    def __init__(self, server_url: str, *, connect_timeout: float = 10.0) -> None:
        self.server_url = server_url
        # No read timeout here: the dispatcher's send_timeout turns a hang into Unknown.
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=connect_timeout),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )

    async def send(self, row: OutboxRow) -> Dispatched:
        body = message_body(row.message, self.server_url)
        try:
            response = await self.client.post(
                row.address,
                content=body,
                headers={"content-type": "application/json", "idempotency-key": row.key},
            )
        except (httpx.ConnectError, httpx.ConnectTimeout):
            return Retryable(codes.HTTP_REFUSED)
        except httpx.HTTPError:
            return Unknown(codes.HTTP_ERROR)
        return classify(response.status_code)

    async def close(self) -> None:
        await self.client.aclose()
