"""NATS: the one connection a node keeps to NATS, and the ``nats://`` sender.

:class:`NatsLink` owns the nats-py client.  It connects in the background and keeps
reconnecting for as long as the server runs (nats-py's own reconnect loop, never
given up), logging a warning when it loses NATS and when it cannot reach it; a NATS
outage never stops troth, it only makes NATS requests and ``nats://`` deliveries wait.
The request ingress (``server/ingress/nats.py``) and :class:`NatsSender` share it.

:class:`NatsSender` publishes ``execute``/``unblock`` (the JSON of an SSE ``data:``
line) to the subject of a ``nats://`` address, exactly as written.  Core NATS has no
acknowledgement, so the outcome is decided by what NATS itself can tell
(docs/operations.md, "NATS"):

* not connected now → ``Retryable`` (``troth.nats.disconnected``): nothing was
  written; nats-py would only buffer it for a reconnect that may never come.
* the publish carries a reply subject troth listens on; NATS answers it with a
  503 status when nobody is subscribed to the subject ("no responders"), and the
  PONG of the flush that follows comes after that answer on the same connection.
  So a flush that returns with a 503 waiting → ``Retryable``
  (``troth.nats.no_responders``: nobody received it, as an SSE group without a
  connection), and without one → ``Completed``: the NATS server took the message
  and routed it to at least one subscriber.
* the publish was written but the flush failed or timed out, or the connection
  was lost and made again between the publish and the flush → ``Unknown``
  (``troth.nats.flush_failed``): it may have been routed; the reconciler decides.
* an address that is no literal subject, or a message over ``max_payload`` →
  ``Permanent``.

nats-py's ``flush()`` writes its PING straight to the socket, while publishes wait
in nats-py's own buffer until its flusher task writes them.  A flush begun while
that task is held up (a socket the kernel drains slowly) would put the PING ahead
of publishes, and its PONG would come back before NATS had even read them: a "no
responders" answer would arrive too late and the send be counted delivered.  So
every flush first waits until nats-py has written what is buffered.

``Completed`` means what it means for SSE: handed to a live subscriber's connection,
not processed — the task's version fences a duplicate, and a lost ``execute`` is
re-emitted by the retry timer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable

import nats.errors
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from troth import redact
from troth.outbox import codes
from troth.outbox.rows import OutboxRow
from troth.outbox.types import Completed, Dispatched, Permanent, Retryable, Unknown
from troth.protocol.address import nats_subject
from troth.transport.messages import message_body

log = logging.getLogger("troth.nats")

#: Seconds between two warnings of one kind about the NATS connection.
WARN_EVERY = 10.0


class NatsLink:
    """One node's connection to NATS, (re)connected in the background."""

    def __init__(self, url: str, *, name: str = "troth", reconnect_wait: float = 1.0) -> None:
        self.url = url
        self.servers = [u.strip() for u in url.split(",") if u.strip()]
        self.name = name
        self.reconnect_wait = reconnect_wait
        self.client = Client()
        self.ready = asyncio.Event()
        #: Called (awaited) after every connect and reconnect, e.g. to subscribe.
        self.on_connect: list[Callable[[], Awaitable[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._warned: dict[str, float] = {}

    @property
    def connected(self) -> bool:
        return self.client.is_connected

    def start(self) -> None:
        """Connect in the background: the server starts serving HTTP meanwhile."""
        if self._task is None:
            self._task = asyncio.create_task(self._connect(), name="troth-nats-connect")

    async def _connect(self) -> None:
        try:
            await self.client.connect(
                self.servers,
                name=self.name,
                error_cb=self._error,
                disconnected_cb=self._disconnected,
                reconnected_cb=self._reconnected,
                max_reconnect_attempts=-1,  # never give up: NATS outages end
                reconnect_time_wait=self.reconnect_wait,  # type: ignore[arg-type]
                connect_timeout=2,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bad URL: nats-py's loop retries everything else
            log.error("NATS: cannot connect to %s: %s; NATS stays off", redact.url(self.url), exc)
            return
        log.info("NATS connected to %s", self._where())
        self.ready.set()
        await self._connected()

    async def _connected(self) -> None:
        for hook in self.on_connect:
            try:
                await hook()
            except Exception:
                log.exception("NATS: setting up after connect failed")

    def _where(self) -> str:
        url = self.client.connected_url
        # host:port only: the netloc would carry a user and password given in nats_url
        return url.netloc.rpartition("@")[2] if url is not None else redact.url(self.url)

    def warn(self, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._warned.get(kind, -WARN_EVERY) >= WARN_EVERY:
            self._warned[kind] = now
            log.warning(message, *args)

    async def _error(self, exc: Exception) -> None:
        self.warn(
            "error", "NATS (%s): %s: %s; retrying", redact.url(self.url), type(exc).__name__, exc
        )

    async def _disconnected(self) -> None:
        if not self.client.is_closed:
            self.warn(
                "disconnected", "NATS connection lost (%s); reconnecting", redact.url(self.url)
            )

    async def _reconnected(self) -> None:
        # nats-py re-subscribes by itself; nothing else needs redoing.
        log.warning("NATS reconnected to %s", self._where())

    async def close(self) -> None:
        """Stop (re)connecting and close the connection, flushing what was published."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if not self.client.is_closed and (self.client.is_connected or self.ready.is_set()):
            try:
                await self.client.close()
            except Exception as exc:
                log.warning("NATS: closing the connection: %s", exc)


class NatsSender:
    """Publishes outbox rows to the subject of their ``nats://`` address.

    One reply subscription per node (``<inbox>.*``), made on the first send, and one
    flush for every publish made while the previous flush was under way: a send
    waits for the first flush that *began after* its publish (its PONG comes after
    any "no responders" answer to that publish), so the sends in flight share one
    PING/PONG instead of a subscription, a flush and an unsubscription each.
    """

    def __init__(self, link: NatsLink, server_url: str, *, flush_timeout: float = 10.0) -> None:
        self.link = link
        self.server_url = server_url
        self.flush_timeout = flush_timeout
        self._client: Client | None = None  # the client the subscription is on
        self._replies: Subscription | None = None
        self._prefix = ""
        self._subscribing = asyncio.Lock()
        self._tokens = itertools.count(1)
        #: Sends published and not yet settled, and those NATS answered "no
        #: responders" for (only tokens of sends still waiting are kept).
        self._waiting: set[str] = set()
        self._refused: set[str] = set()
        #: The flush the next publishes join, not begun yet; whether one is under way.
        self._next: asyncio.Future[bool] | None = None
        self._flushing = False
        self._flusher: asyncio.Task[None] | None = None

    async def _subscription(self, nc: Client) -> Subscription:
        """The node's reply subscription on ``nc`` (nats-py renews it on a reconnect)."""
        async with self._subscribing:
            if self._replies is None or self._client is not nc:
                self._prefix = nc.new_inbox()
                self._replies = await nc.subscribe(self._prefix + ".*")
                self._client = nc
            return self._replies

    async def send(self, row: OutboxRow) -> Dispatched:
        subject = nats_subject(row.address)
        if subject is None:
            return Permanent(codes.BAD_ADDRESS)
        nc = self.link.client
        if not nc.is_connected:
            return Retryable(codes.NATS_DISCONNECTED)
        payload = message_body(row.message, self.server_url)
        if len(payload) > nc.max_payload:
            return Permanent(codes.NATS_TOO_LARGE)
        try:
            replies = await self._subscription(nc)
        except nats.errors.Error:
            return Retryable(codes.NATS_DISCONNECTED)
        token = str(next(self._tokens))
        self._waiting.add(token)
        connection = nc.stats["reconnects"]  # which of the client's connections publishes
        try:
            try:
                await nc.publish(
                    subject,
                    payload,
                    reply=f"{self._prefix}.{token}",
                    headers={"Idempotency-Key": row.key},
                )
            except (
                nats.errors.OutboundBufferLimitError,
                nats.errors.ConnectionClosedError,
                nats.errors.ConnectionDrainingError,
                nats.errors.ConnectionReconnectingError,
            ):
                return Retryable(codes.NATS_DISCONNECTED)
            except nats.errors.BadSubjectError:
                return Permanent(codes.BAD_ADDRESS)
            except nats.errors.MaxPayloadError:
                return Permanent(codes.NATS_TOO_LARGE)
            # Shielded: a send cancelled while it waits must not cancel the flush
            # the other sends share.
            if not await asyncio.shield(self._flushed(nc, replies)):
                return Unknown(codes.NATS_FLUSH_FAILED)
            if token in self._refused:
                return Retryable(codes.NATS_NO_RESPONDERS)
            if nc.stats["reconnects"] != connection:
                # Published on a connection since lost: the flush that returned went
                # over the new one and says nothing of the publish.
                return Unknown(codes.NATS_FLUSH_FAILED)
            return Completed()
        finally:
            self._waiting.discard(token)
            self._refused.discard(token)

    def _flushed(self, nc: Client, replies: Subscription) -> asyncio.Future[bool]:
        """A flush begun after the caller's publish: True once its PONG came (and the
        replies read before it were sorted), False if it failed or timed out."""
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            if not self._flushing:
                self._flushing = True
                self._flusher = asyncio.create_task(self._flush(nc, replies))
        return self._next

    async def _flush(self, nc: Client, replies: Subscription) -> None:
        try:
            while self._next is not None:
                joined, self._next = self._next, None
                ok = False
                try:
                    await self._ping_after_publishes(nc)
                    await self._sort(replies)
                    ok = True
                except Exception:
                    pass  # the sends that joined it are Unknown: the reconciler decides
                finally:
                    if not joined.done():
                        joined.set_result(ok)
        finally:
            self._flushing = False
            if self._next is not None and not self._next.done():
                self._next.set_result(False)  # cancelled with sends still waiting
                self._next = None

    async def _ping_after_publishes(self, nc: Client) -> None:
        """PING/PONG once nats-py has written every publish made so far (see the
        module's docstring): a flush request queued to nats-py's flusher is done only
        when the flusher has written its whole buffer, publishes included."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        written = getattr(nc, "_flush_pending", None)  # nats-py 2.x; private
        if written is not None:
            await asyncio.wait_for(written(force_flush=True), self.flush_timeout)
        left = self.flush_timeout - (loop.time() - began)
        if left <= 0:
            raise nats.errors.FlushTimeoutError
        await nc.flush(left)  # type: ignore[arg-type]

    async def _sort(self, replies: Subscription) -> None:
        """Note every "no responders" answer already read (queued on the subscription
        by the reader before the PONG that ended the flush)."""
        while replies.pending_msgs:
            msg = await replies.next_msg()
            token = msg.subject.rpartition(".")[2]
            if token in self._waiting:
                self._refused.add(token)
