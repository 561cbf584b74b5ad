"""Requests over NATS: what the SDKs' NATS connector (``resonate-nats``) sends.

The connector publishes each request envelope, byte for byte as ``POST /`` takes it,
to ``{prefix}.requests.{base64url(origin)}`` with a header ``Resonate-Reply-To:
<inbox>``, and waits for one message on that inbox holding the response envelope.
Every node queue-subscribes ``{prefix}.requests.>`` in one queue group (``troth``),
so NATS hands each request to one node; each is served through the very function
``POST /`` uses (``Envelopes`` in ``server/ingress/envelope.py``: validation, limits, auth
from ``head.auth``, the engine's group commit), concurrently, and answered on
``Resonate-Reply-To`` (the message's own reply subject when that header is absent).

The origin is read from the subject, never from the connector's ``resonate:origin``
header: a colon is not allowed in a NATS header name (nats-py 2.16 refuses to send
it, and receivers split the line at the colon, reading a header ``resonate``).  troth
needs the origin for nothing but its access log: it has no partitions.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import logging
import time
from collections.abc import Callable
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

#: ``Envelopes.answer_soon``'s answer: ``(kind, corrId, status, data, admitted)``.
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
    """Serves the request subjects of one node.

    A request has no task or coroutine of its own (as a simple ``POST /`` has none,
    ``server/http/direct.py``): ``handle`` is ``Envelopes.answer_soon``
    (``server/ingress/envelope.py``), which answers at once where nothing waits and otherwise
    calls back when the request's batch committed.
    The answers of one batch arrive in one pass of the event loop; they are published
    together by one task, and nats-py writes them in one go.
    """

    def __init__(
        self,
        link: NatsLink,
        prefix: str,
        handle: Callable[[bytes, Callable[[Answer], None]], Answer | None],
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
        #: Requests taken and not yet answered; set when there are none (shutdown).
        self.waiting = 0
        self.idle = asyncio.Event()
        self.idle.set()
        #: Answers to publish ``(subject, body)``, and the task publishing them.
        self.outgoing: list[tuple[str, bytes]] = []
        self.publisher: asyncio.Task[None] | None = None
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
        self.waiting += 1
        self.idle.clear()
        started = time.perf_counter()
        reply = msg.reply
        for name, value in (msg.headers or {}).items():
            if name.lower() == REPLY_HEADER:
                reply = value
                break
        done = functools.partial(self.finish, msg.subject, reply, started)
        if len(msg.data) > self.max_body:
            done(("unknown", "0", 413, "Request body too large", None))
            return
        try:
            answer = self.handle(msg.data, done)
        except Exception:  # Envelopes.answer_soon answers every error itself; a safety net
            log.exception("NATS: serving a request on %s failed", msg.subject)
            answer = ("unknown", "0", 500, "Internal error", None)
        if answer is not None:
            done(answer)

    def finish(self, subject: str, reply: str, started: float, answer: Answer) -> None:
        """One request answered: count and log it, and queue its answer."""
        try:
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
            origin = origin_of(subject, self.prefix)
            via = f" via=nats origin={origin}"
            self.answered((kind, corr, status, data, admitted), started, via)
            if not reply:
                self.link.warn(
                    "no-reply",
                    "NATS request %s corrId=%s on %s has nowhere to answer",
                    kind,
                    corr,
                    subject,
                )
                return
            self.outgoing.append((reply, body))
            if self.publisher is None:
                self.publisher = asyncio.get_running_loop().create_task(self.publish())
        finally:
            self.slots.release()
            self.waiting -= 1
            self._settle()

    async def publish(self) -> None:
        """Publish every answer queued (more may be queued meanwhile)."""
        nc = self.link.client
        try:
            while self.outgoing:
                batch, self.outgoing = self.outgoing, []
                for reply, body in batch:
                    try:
                        await nc.publish(reply, body)
                    except Exception as exc:
                        self.link.warn("reply", "NATS: could not answer on %s: %s", reply, exc)
        finally:
            self.publisher = None
            self._settle()

    def _settle(self) -> None:
        """Idle (for shutdown) once nothing is waiting, queued or being published."""
        if self.waiting == 0 and not self.outgoing and self.publisher is None:
            self.idle.set()

    async def stop(self) -> None:
        """Take no more requests; answer those in flight (up to :data:`DRAIN_SECONDS`)."""
        self.stopping = True
        if self.sub is not None:
            try:
                await self.sub.unsubscribe()
            except Exception as exc:
                log.debug("NATS: unsubscribe on shutdown: %s", exc)
        if not self.idle.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.idle.wait(), DRAIN_SECONDS)
