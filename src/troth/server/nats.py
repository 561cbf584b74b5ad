"""Requests over NATS: what the SDKs' NATS connector (``resonate-nats``) sends.

The connector publishes each request envelope, byte for byte as ``POST /`` takes it,
to ``{prefix}.requests.{base64url(origin)}`` with a header ``Resonate-Reply-To:
<inbox>``, and waits for one message on that inbox holding the response envelope.
Every node queue-subscribes ``{prefix}.requests.>`` in one queue group (``troth``),
so NATS hands each request to one node; each is served through the very function
``POST /`` uses (``App.envelope``: validation, limits, auth from ``head.auth``, the
engine's group commit), concurrently, and answered on ``Resonate-Reply-To`` (the
message's own reply subject when that header is absent).

The origin is read from the subject, never from the connector's ``resonate:origin``
header: a colon is not allowed in a NATS header name (nats-py 2.16 refuses to send
it, and receivers split the line at the colon, reading a header ``resonate``).  troth
needs the origin for nothing but its access log: it has no partitions.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from troth.protocol.envelope import encode_response
from troth.transport.nats import NatsLink

log = logging.getLogger("troth.nats")

#: The queue group every troth node subscribes in: one node serves each request.
QUEUE = "troth"
#: The header naming where the answer goes (the connector's ``REPLY_HEADER``).
REPLY_HEADER = "resonate-reply-to"
#: Requests served at once by one node; past it NATS holds the rest (and, past
#: nats-py's pending limits, drops them as a slow consumer: the client times out).
CONCURRENCY = 1024
#: Seconds shutdown waits for requests in flight to be answered.
DRAIN_SECONDS = 10.0

#: ``App.envelope``'s answer: ``(kind, corrId, status, data, admitted)``.
Answer = tuple[str, str, int, object, Any]


def origin_of(subject: str, prefix: str) -> str | None:
    """The origin a request subject names (``{prefix}.requests.{base64url(origin)}``,
    unpadded), or None when the subject has no such token (or one that does not
    decode to printable text: it goes into a log line)."""
    head = f"{prefix}.requests."
    if not subject.startswith(head):
        return None
    token = subject[len(head) :]
    try:
        padded = token + "=" * (-len(token) % 4)
        origin = base64.b64decode(padded, altchars=b"-_", validate=True).decode()
    except (binascii.Error, ValueError):
        return None
    return origin if origin.isprintable() else None


class NatsIngress:
    """Serves the request subjects of one node."""

    def __init__(
        self,
        link: NatsLink,
        prefix: str,
        handle: Callable[[bytes], Awaitable[Answer]],
        answered: Callable[[Answer, float, str], None],
        *,
        max_body: int,
        concurrency: int = CONCURRENCY,
    ) -> None:
        self.link = link
        self.prefix = prefix
        self.subject = f"{prefix}.requests.>"
        self.handle = handle
        self.answered = answered
        self.max_body = max_body
        self.slots = asyncio.Semaphore(concurrency)
        self.inflight: set[asyncio.Task[None]] = set()
        self.sub: Subscription | None = None
        self.stopping = False

    def start(self) -> None:
        self.link.on_connect.append(self.subscribe)
        self.link.start()

    async def subscribe(self) -> None:
        """Once, at the first connect: nats-py re-subscribes by itself on reconnects."""
        if self.sub is None and not self.stopping:
            self.sub = await self.link.client.subscribe(self.subject, queue=QUEUE, cb=self.take)
            log.info("NATS: serving requests on %s (queue group %s)", self.subject, QUEUE)

    async def take(self, msg: Msg) -> None:
        """nats-py calls this once per message, one after another: start serving it
        and return, so that requests are served concurrently (and grouped into
        commits); wait only when ``concurrency`` are in flight."""
        await self.slots.acquire()
        task = asyncio.create_task(self.serve(msg))
        self.inflight.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.inflight.discard(task)
        self.slots.release()

    async def serve(self, msg: Msg) -> None:
        started = time.perf_counter()
        reply = msg.reply
        for name, value in (msg.headers or {}).items():
            if name.lower() == REPLY_HEADER:
                reply = value
                break
        answer: Answer
        if len(msg.data) > self.max_body:
            answer = ("unknown", "0", 413, "Request body too large", None)
        else:
            try:
                answer = await self.handle(msg.data)
            except Exception:  # App.envelope answers every error itself; a safety net
                log.exception("NATS: serving a request on %s failed", msg.subject)
                answer = ("unknown", "0", 500, "Internal error", None)
        kind, corr, status, data, admitted = answer
        body = encode_response(kind, corr, status, data)
        nc = self.link.client
        if len(body) > nc.max_payload:
            # The answer would be refused by NATS and the client would wait out its
            # timeout; tell it instead (what it asked for was done: status says how).
            data = (
                f"Answer too large for NATS: {len(body)} bytes, the server's max_payload "
                f"is {nc.max_payload}; the request was served with status {status} "
                "(read the answer over HTTP)"
            )
            status = 500
            body = encode_response(kind, corr, status, data)
        origin = origin_of(msg.subject, self.prefix)
        self.answered((kind, corr, status, data, admitted), started, f" via=nats origin={origin}")
        if not reply:
            self.link.warn(
                "no-reply",
                "NATS request %s corrId=%s on %s has nowhere to answer",
                kind,
                corr,
                msg.subject,
            )
            return
        try:
            await nc.publish(reply, body)
        except Exception as exc:
            self.link.warn("reply", "NATS: could not answer %s corrId=%s: %s", kind, corr, exc)

    async def stop(self) -> None:
        """Take no more requests; answer those in flight (up to :data:`DRAIN_SECONDS`)."""
        self.stopping = True
        if self.sub is not None:
            try:
                await self.sub.unsubscribe()
            except Exception as exc:
                log.debug("NATS: unsubscribe on shutdown: %s", exc)
        if self.inflight:
            await asyncio.wait(set(self.inflight), timeout=DRAIN_SECONDS)
