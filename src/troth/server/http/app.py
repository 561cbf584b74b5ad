"""The ASGI application: ``POST /``, ``/health``, ``/ready``, SSE, the operator API,
the dashboard, legacy paths — and the node's lifespan.

A plain ASGI callable, no framework: the protocol has one endpoint and a handful of
GET routes, and every layer between the socket and the engine costs throughput.
It can be driven without a socket (tests pass it to httpx's ASGI transport).  What
it routes to lives beside it: the envelope handler every ingress shares
(``server/ingress/envelope.py``), the access log (``server/ingress/access.py``), the SSE streams
(``server/http/sse.py``), the operator API and actions (``server/operator/api.py``,
``server/operator/actions.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from troth import PROTOCOL_VERSION
from troth.asgi_types import Receive, Scope, Send
from troth.engine import Engine
from troth.flow.limits import parse_limits
from troth.protocol.envelope import encode_response
from troth.protocol.limits import too_long
from troth.server.config import Settings, cors_origins
from troth.server.delivery.bounces import BounceTracker
from troth.server.delivery.cluster import Cluster
from troth.server.delivery.loop import DeliveryLoop
from troth.server.http.asgi import (
    RETRY_AFTER,
    BodyTooLarge,
    ClientGone,
    read_body,
    refuse,
    respond,
    send_bytes,
)
from troth.server.http.cors import Cors, served
from troth.server.http.sse import PollStreams
from troth.server.ingress.access import AccessLog, answered_by
from troth.server.ingress.auth import Authenticator, Denied
from troth.server.ingress.envelope import Answer, Answered, Envelopes, Hooks
from troth.server.ingress.nats import NatsIngress
from troth.server.metrics import Metrics
from troth.server.operator.actions import OperatorActions
from troth.server.operator.api import OperatorApi
from troth.server.operator.retention import RetentionLoop
from troth.store.faults import StoreFault
from troth.transport.nats import NatsLink
from troth.transport.poll import Registry
from troth.ui import Dashboard
from troth.version import health as build_health

log = logging.getLogger("troth.server")

LEGACY_PREFIXES = ("/promises", "/tasks", "/schedules")
#: Operator surfaces: an admin token when auth is on (docs/security.md).
ADMIN_PREFIXES = ("/metrics", "/ops/")
#: Seconds ``/ready`` waits for the store; seconds without a committed write after
#: which it asks for a probe's commit rather than a ping.
READY_TIMEOUT = 2.0
QUIET = 5.0


class App:
    """The troth HTTP application around one :class:`Engine`."""

    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        *,
        metrics: Metrics | None = None,
        registry: Registry | None = None,
        delivery: DeliveryLoop | None = None,
        cluster: Cluster | None = None,
        on_shutdown: Callable[[], Awaitable[None]] | None = None,
        bounces: BounceTracker | None = None,
        node: str = "",
        retention: RetentionLoop | None = None,
        nats: NatsLink | None = None,
        hooks: Hooks | None = None,
        scrape: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.engine = engine
        #: None unless tracing is on: each hook point then pays one ``is not None``.
        self.hooks = hooks
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.registry = registry or Registry(
            max_total=settings.max_sse, max_per_group=settings.max_sse_per_group
        )
        self.limits = settings.limits
        self.node = node or settings.node_id or "local"
        self.access = AccessLog(self.metrics, self.node)
        #: Counts and logs one answered request; chosen once, here, so that the
        #: plain format's request path does no more than it always did.
        self.answered: Answered = answered_by(self.access, settings.log_format, hooks)
        #: None when auth is off: the hot path then pays one ``is not None``.
        self.auth = Authenticator.from_settings(
            settings.auth_publickey, settings.auth_issuer, settings.auth_audience
        )
        #: None when CORS is off (the default): the hot path pays one ``is not None``.
        self.cors = (
            Cors(cors_origins(settings.cors_allow_origins)) if settings.cors_allow_origins else None
        )
        self.delivery = delivery
        self.cluster = cluster
        self.on_shutdown = on_shutdown
        #: Tasks that keep bouncing (server/delivery/bounces.py): event loop only.
        self.bounces = bounces or BounceTracker(settings.retry_timeout)
        tracker = self.bounces
        self.metrics.gauge(
            "troth_tasks_in_backoff", lambda: float(tracker.in_backoff(engine.clock()))
        )
        #: Every request envelope, whichever way it came (``POST /``, NATS).
        self.envelopes = Envelopes(
            engine, settings, self.metrics, self.bounces, delivery, self.auth, hooks
        )
        self.closing = asyncio.Event()
        #: ``GET /poll/{group}/{id}``.
        self.streams = PollStreams(
            self.registry,
            settings.keepalive,
            self.closing,
            self.bounces,
            engine.clock,
            delivery,
            cluster,
        )
        view = cluster.view if cluster is not None else None
        self.operator = OperatorApi(
            engine.store,
            self.registry,
            self.bounces,
            engine.clock,
            node=self.node,
            url=settings.url,
            cluster_view=view,
            nats_state=nats_state(nats),
        )
        #: ``POST /ops/…``: cancel a workflow, retry failed deliveries.
        self.actions = OperatorActions(engine, delivery)
        self.retention = retention
        self.dashboard = Dashboard() if settings.ui else None  # GET /ui (troth/ui)
        #: Requests over NATS (``nats_url``), served as ``POST /`` is.
        self.nats = (
            None
            if nats is None
            else NatsIngress(
                nats,
                settings.nats_prefix,
                self.envelopes.nats_answer,
                self.answered,
                max_body=settings.max_body,
            )
        )
        #: Reads what ``/metrics`` shows of the store before it renders (server/http/scrape.py).
        self.scrape = scrape
        self.started = False

    # -- ASGI entry point -----------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self.http(scope, receive, send)
        elif kind == "lifespan":
            await self.lifespan(receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        if not self.started:
            await self.engine.start()
            seeds = parse_limits(self.settings.flow_limits)
            if seeds:
                fresh = await self.engine.seed_limits(seeds)
                kept = [s.group for s in seeds if s.group not in fresh]
                log.info(
                    "flow_limits: set the limits of %s; kept the store's of %s",
                    ", ".join(fresh) or "no group",
                    ", ".join(kept) or "no group",
                )
            if self.delivery is not None:
                self.delivery.start()
            if self.cluster is not None:
                await self.cluster.start()
            if self.retention is not None:
                self.retention.start()
            if self.nats is not None:
                self.nats.start()
            self.started = True

    async def shutdown(self) -> None:
        """Stop delivery first (no new sends), then the engine (commits what is queued)."""
        if self.started:
            self.closing.set()
            if self.nats is not None:
                await self.nats.stop()  # no new NATS requests; those in flight answered
            if self.retention is not None:
                await self.retention.stop()
            if self.cluster is not None:
                await self.cluster.stop()
            if self.delivery is not None:
                await self.delivery.stop()
            if self.nats is not None:
                await self.nats.link.close()
            if self.on_shutdown is not None:
                await self.on_shutdown()
            await self.engine.stop()
            self.started = False
            if self.hooks is not None:
                await self.hooks.close()

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        if self.cors is not None and served(path):
            # Before auth: a preflight carries no token, and a refusal must reach the page.
            origin = self.cors.allow(scope.get("headers", ()))
            if method == "OPTIONS":
                await self.cors.preflight(send, origin)
                return
            if origin is not None:
                send = self.cors.wrap(send, origin)
        if self.auth is not None and path != "/" and (denied := self.gate(scope, path)):
            await refuse(send, denied)
            return
        if path == "/":
            if method != "POST":
                await respond(send, 405, {"error": "use POST / with a protocol envelope"})
                return
            await self.protocol(scope, receive, send)
        elif path == "/health":
            await respond(send, 200, build_health())
        elif path == "/ready":
            await self.ready(send)
        elif path.startswith("/poll/") and method == "GET":
            parts = path.split("/")
            if len(parts) != 4 or not parts[2] or not parts[3]:
                await respond(send, 404, {"error": "use GET /poll/{group}/{id}"})
                return
            if too_long(parts[2], self.limits.max_id) or too_long(parts[3], self.limits.max_id):
                await respond(
                    send,
                    414,
                    {"error": f"poll group and id are at most {self.limits.max_id} bytes each"},
                )
                return
            await self.streams.poll(receive, send, parts[2], parts[3])
        elif path.rstrip("/") == "/ops/limits" and method == "GET":
            status, answer = await self.actions.limits()
            await respond(send, status, answer)
        elif path.startswith("/ops/") and method == "GET":
            status, answer = await self.operator.answer(path, scope.get("query_string", b""))
            await respond(send, status, answer)
        elif path.startswith("/ops/") and method == "POST":
            try:
                body = await read_body(scope, receive, self.settings.max_body)
            except BodyTooLarge:
                await respond(send, 413, {"error": "Request body too large"})
                return
            except ClientGone:
                return
            status, answer = await self.actions.answer(path, body)
            await respond(send, status, answer)
        elif path == "/metrics" and method == "GET":
            if self.scrape is not None:
                await self.scrape()
            body = self.metrics.render().encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/plain; version=0.0.4")],
                }
            )
            await send({"type": "http.response.body", "body": body})
        elif self.dashboard is not None and self.dashboard.matches(path):
            await self.dashboard(path, method, send)
        elif path.startswith(LEGACY_PREFIXES):
            await respond(
                send,
                410,
                {
                    "error": "This endpoint is no longer supported. "
                    f"Please update to an SDK that speaks protocol {PROTOCOL_VERSION}."
                },
            )
        else:
            await respond(send, 404, {"error": f"no route for {method} {path}"})

    def gate(self, scope: Scope, path: str) -> Denied | None:
        """Auth for the GET surfaces (``POST /`` checks its envelope's token itself):
        ``/health`` and ``/ready`` stay open, operator paths need an admin token,
        ``/poll/{group}/…`` a token that may poll that group."""
        assert self.auth is not None
        if path.startswith(ADMIN_PREFIXES):
            return self.auth.require_admin(scope.get("headers", ()))
        if path.startswith("/poll/"):
            return self.auth.may_poll(scope.get("headers", ()), path.split("/")[2])
        return None

    async def ready(self, send: Send) -> None:
        """200 while the store takes writes; 503 with the reason while it does not
        (``engine/health.py``).  Between faults, a store that committed no write for
        :data:`QUIET` seconds is asked to commit the probe's; one that did is pinged.
        What either meets is an episode's start, as a refused batch would be."""
        engine = self.engine
        health = engine.health
        if health.fault is None:
            quiet = health.quiet_for() >= QUIET
            try:
                await asyncio.wait_for(engine.probe(write=quiet), READY_TIMEOUT)
            except TimeoutError:
                error = f"the store did not answer within {READY_TIMEOUT:g} s"
                engine.refused(StoreFault("unavailable", error))
        if health.fault is not None:
            await respond(send, 503, health.answer())
            return
        await respond(send, 200, {"status": "ready", "store": engine.store.name})

    # -- POST / ---------------------------------------------------------------------

    async def protocol(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        try:
            body = await read_body(scope, receive, self.settings.max_body)
        except BodyTooLarge:
            await self.answer(send, ("unknown", "0", 413, "Request body too large", None), started)
            return
        except ClientGone:
            self.access.client_gone(started)
            return
        await self.respond(body, scope.get("headers", ()), send, started)

    async def respond(
        self, body: bytes, headers: Iterable[tuple[bytes, bytes]], send: Send, started: float
    ) -> None:
        """Answer one ``POST /`` whose body was read."""
        await self.answer(send, await self.envelopes.envelope(body, headers), started)

    async def answer(self, send: Send, answer: Answer, started: float) -> None:
        kind, corr, status, data, _ = answer
        body = encode_response(kind, corr, status, data)
        await send_bytes(send, status, body, RETRY_AFTER if status == 503 else None)
        self.answered(answer, started)


def nats_state(link: NatsLink | None) -> Callable[[], str]:
    """This node's NATS connection in a word, as ``troth explain`` reasons with it."""
    if link is None:
        return lambda: "off"
    return lambda: "connected" if link.connected else "disconnected"
