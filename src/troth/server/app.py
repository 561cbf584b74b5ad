"""The ASGI application: ``POST /``, ``/health``, ``/ready``, legacy paths.

A plain ASGI callable, no framework: the protocol has one endpoint and a handful of
GET routes, and every layer between the socket and the engine costs throughput.
It can be driven without a socket (tests pass it to httpx's ASGI transport).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol, get_args

import msgspec

from troth import PROTOCOL_VERSION
from troth.engine import Engine, Traced
from troth.flow.limits import parse_limits
from troth.machine.core import request_ids
from troth.machine.state import Response
from troth.plural import counted
from troth.protocol import requests as rq
from troth.protocol.envelope import EnvelopeError, decode_envelope, encode_response
from troth.protocol.limits import too_long
from troth.protocol.records import TaskRecord
from troth.protocol.requests import BadRequest, decode_data
from troth.server.actions import OperatorActions
from troth.server.auth import Authenticator, Denied, Grant, authorize
from troth.server.bounces import BounceTracker, Refusal
from troth.server.cluster import Cluster
from troth.server.config import Settings, cors_origins
from troth.server.cors import Cors, served
from troth.server.delivery import DeliveryLoop
from troth.server.logs import FIELDS, access_fields
from troth.server.metrics import Metrics
from troth.server.nats import NatsIngress
from troth.server.operator import OperatorApi
from troth.server.retention import RetentionLoop
from troth.store.base import Outcome
from troth.store.faults import StoreFault, StoreUnavailable
from troth.store.outbox import REVIVE_WINDOW
from troth.transport.nats import NatsLink
from troth.transport.poll import Connection, Full, Registry
from troth.ui import Dashboard
from troth.version import health as build_health

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
#: What an envelope is answered with: ``(kind, corrId, status, data, admitted)``; the
#: last is the request as admitted, None for one refused before (what the JSON access
#: line and a trace span say of it: ``server/logs.py``, ``server/tracing.py``).
Answer = tuple[str, str, int, object, "Admitted | None"]

log = logging.getLogger("troth.server")
access = logging.getLogger("troth.access")
#: One line per granted ``task.acquire``, written before the answer leaves: an audit
#: trail of who held which task version (operators, and the multi-node tests).
grants = logging.getLogger("troth.grants")

LEGACY_PREFIXES = ("/promises", "/tasks", "/schedules")
#: Operator surfaces: an admin token when auth is on (docs/security.md).
ADMIN_PREFIXES = ("/metrics", "/ops/")
JSON = [(b"content-type", b"application/json")]
#: What a 503 answer to an envelope adds: the store refuses writes for now (full,
#: read-only, out of reach); the request may be sent again (docs/protocol.md).
RETRY_AFTER = [(b"retry-after", b"1")]
#: Seconds ``/ready`` waits for the store; seconds without a committed write after
#: which it asks for a probe's commit rather than a ping.
READY_TIMEOUT = 2.0
QUIET = 5.0
_json = msgspec.json.Encoder()


def log_grant(kind: str, corr: str, response: Response) -> None:
    """Audit one lease granted (``task.acquire``, or a ``task.create`` that made or
    took the task for its caller); logged after the commit, before the answer."""
    data = response.data
    task = data.get("task") if isinstance(data, dict) else None
    if isinstance(task, TaskRecord) and task.state == "acquired":
        grants.info(
            "acquired task=%s version=%d pid=%s corrId=%s via=%s",
            task.id,
            task.version,
            task.pid,
            corr,
            kind,
        )


#: Requests whose answer says something of a task's worker (``App.worker_reported``).
_WorkerReport = rq.TaskSuspend | rq.TaskFulfill | rq.TaskFence | rq.TaskHeartbeat
#: The same kinds as types, and those whose 200 grants a lease: a set lookup per
#: answer (~70 ns), not an ``isinstance`` over a union (~470 ns, and ``A | B`` in
#: the call made the union anew each time).
_REPORTS = frozenset(get_args(_WorkerReport))
_GRANTS = frozenset((rq.TaskAcquire, rq.TaskCreate))


@dataclass(slots=True)
class Admitted:
    """A request envelope that passed decoding, auth and the limits (``App.admit``)."""

    kind: str
    corr: str
    req: rq.Req
    now: int
    head: dict[str, Any]
    debug_time: int | None
    #: What the request's job runs after the machine with tracing on
    #: (``server/tracing.py``: ``TracedAdmitted``); None with it off.
    traced: Traced | None = None


class Answered(Protocol):
    """What counts and logs one answered request (:attr:`App.answered`)."""

    def __call__(self, answer: Answer, started: float, via: str = "") -> None: ...


class Hooks(Protocol):
    """What an observer adds to the request path, passed to :class:`App` rather than
    subclassing it, so that the app stays one class and, with none given, the request
    path pays one ``is not None`` where a hook would run.  Tracing is the one there is
    (``server/tracing.py``: :class:`~troth.server.tracing.Tracing`)."""

    def admitted(self, admitted: Admitted, headers: Iterable[tuple[bytes, bytes]]) -> Admitted:
        """The request as admitted, perhaps replaced by one carrying more (its trace
        context, read from the transport's ``headers`` or the envelope's head)."""
        ...

    def answered(self, inner: Answered) -> Answered:
        """What counts and logs one answered request, given the app's own: called once,
        when the app is built."""
        ...

    async def close(self) -> None:
        """The app was shut down, after the engine stopped."""
        ...


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    """The client disconnected (or was cut off as too slow) before its body arrived."""


class Throttled:
    """At most one warning a second per reason; the rest are counted into the next."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.last: dict[str, float] = {}
        self.quiet: dict[str, int] = {}

    def warning(self, reason: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self.last.get(reason, -2.0) < 1.0:
            self.quiet[reason] = self.quiet.get(reason, 0) + 1
            return
        self.last[reason] = now
        suppressed = self.quiet.pop(reason, 0)
        if suppressed:
            message += f" (and {suppressed} more in the last second)"
        self.logger.warning(message, *args)


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
        #: Counts and logs one answered request; chosen once, here, so that the
        #: plain format's request path does no more than it always did.
        self.answered: Answered = self.choose_answered()
        #: None when auth is off: the hot path then pays one ``is not None``.
        self.auth = Authenticator.from_settings(
            settings.auth_publickey, settings.auth_issuer, settings.auth_audience
        )
        #: None when CORS is off (the default): the hot path pays one ``is not None``.
        self.cors = (
            Cors(cors_origins(settings.cors_allow_origins)) if settings.cors_allow_origins else None
        )
        self.refusals = Throttled(log)
        self.delivery = delivery
        self.cluster = cluster
        self.on_shutdown = on_shutdown
        #: Tasks that keep bouncing (server/bounces.py): event loop only.
        self.bounces = bounces or BounceTracker(settings.retry_timeout)
        tracker = self.bounces
        self.metrics.gauge(
            "troth_tasks_in_backoff", lambda: float(tracker.in_backoff(engine.clock()))
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
        #: Requests over NATS (``nats_url``), served by :meth:`envelope` as ``POST /``.
        self.nats = (
            None
            if nats is None
            else NatsIngress(
                nats,
                settings.nats_prefix,
                self.nats_answer,
                self.answered,
                max_body=settings.max_body,
            )
        )
        #: Reads what ``/metrics`` shows of the store before it renders (server/scrape.py).
        self.scrape: Callable[[], Awaitable[None]] | None = None
        self.started = False
        #: ``debug.*`` and ``task.release`` of :meth:`answer_soon` in progress (a task
        #: nothing else holds could be collected before it ends).
        self._tasks: set[asyncio.Future[Response]] = set()
        self.closing = asyncio.Event()

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
            await self.poll(receive, send, parts[2], parts[3])
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
            seconds = time.perf_counter() - started
            access.info(
                "unknown corrId=0 status=499 ms=%.2f (client gone before its body)",
                seconds * 1000,
                extra={FIELDS: access_fields("unknown", "0", (), 499, seconds, self.node, "")},
            )
            return
        await self.respond(body, scope.get("headers", ()), send, started)

    async def respond(
        self, body: bytes, headers: Iterable[tuple[bytes, bytes]], send: Send, started: float
    ) -> None:
        """Answer one ``POST /`` whose body was read."""
        await self.answer(send, await self.envelope(body, headers), started)

    async def envelope(self, body: bytes, headers: Iterable[tuple[bytes, bytes]]) -> Answer:
        """One request envelope, whichever way it came (HTTP ``POST /``, NATS): decode,
        auth, limits, the engine (group commit) or the debug surface.  Returns what to
        answer, ``(kind, corrId, status, data)``; it never raises.

        Shared by every ingress so that they cannot drift apart: a check added here
        holds for HTTP and NATS alike (:meth:`answer_soon` is the same three steps
        without a coroutine).  ``headers`` are the transport's (HTTP: the
        ``Authorization: Bearer`` fallback of auth); ``head.auth`` is read first."""
        admitted = self.admit(body, headers)
        if not isinstance(admitted, Admitted):
            return admitted
        try:
            return self.conclude(admitted, await self.dispatch(admitted))
        except Exception as exc:
            return self.failed(admitted, exc)

    def answer_soon(
        self, body: bytes, headers: Iterable[tuple[bytes, bytes]], done: Callable[[Answer], None]
    ) -> Answer | None:
        """:meth:`envelope` for a caller that takes the answer by callback (a simple
        ``POST /``, ``server/direct.py``): the answer itself where nothing waits (a
        refusal, a point read), and ``done`` is not called; else None, and ``done`` is
        called when the request's batch is committed — no task and no coroutine per
        request."""
        admitted = self.admit(body, headers)
        if not isinstance(admitted, Admitted):
            return admitted
        if admitted.kind.startswith("debug.") or isinstance(admitted.req, rq.TaskRelease):
            task = asyncio.ensure_future(self.dispatch(admitted))
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._dispatched, admitted, done))
            return None
        later = functools.partial(self._committed, admitted, done)
        try:
            response = self.engine.submit(
                admitted.req, admitted.now, admitted.head, later, admitted.traced
            )
            if response is None:
                return None  # _committed answers, after the commit
            return self.conclude(admitted, response)
        except Exception as exc:
            return self.failed(admitted, exc)

    def _committed(
        self, admitted: Admitted, done: Callable[[Answer], None], outcome: Outcome[Response]
    ) -> None:
        done(self._answer_of(admitted, outcome.result))

    def _dispatched(
        self, admitted: Admitted, done: Callable[[Answer], None], task: asyncio.Future[Response]
    ) -> None:
        self._tasks.discard(task)
        done(self._answer_of(admitted, task.result))

    def _answer_of(self, admitted: Admitted, response: Callable[[], Response]) -> Answer:
        """:meth:`conclude` with what ``response()`` returns, or :meth:`failed` with
        what it raises."""
        try:
            return self.conclude(admitted, response())
        except Exception as exc:
            return self.failed(admitted, exc)

    def admit(self, body: bytes, headers: Iterable[tuple[bytes, bytes]]) -> Answer | Admitted:
        """What comes before the engine: the envelope decoded and authorised, its
        request checked against the limits — or the answer that refuses it."""
        try:
            env = decode_envelope(body, self.limits.max_depth)
        except EnvelopeError as exc:
            return exc.kind, exc.corr_id, 400, str(exc), None
        kind, corr = env.kind, env.head.corrId
        grant: Grant | None = None
        if self.auth is not None:
            checked = self.auth.authenticate(env.head.auth, headers)
            if isinstance(checked, Denied):
                return kind, corr, checked.status, checked.message, None
            grant = checked
        if kind.startswith("debug.") and not self.settings.debug:
            return kind, corr, 403, "Debug operations are disabled", None
        try:
            req = decode_data(kind, env.data)
        except BadRequest as exc:
            return kind, corr, 400, str(exc), None
        refused = self.limits.check_request(req, len(body))
        if refused is not None:
            return kind, corr, 400, refused, None
        if grant is not None:
            allowed = authorize(grant, kind, req)
            if isinstance(allowed, Denied):
                return kind, corr, allowed.status, allowed.message, None
            req = allowed  # a search narrowed to the token's prefix
        now = self.engine.clock()
        debug_time = env.head.debug_time
        if self.settings.debug and debug_time is not None:
            now = debug_time
        head: dict[str, Any] = {"version": env.head.version}
        if env.head.traceparent is not None:  # for server/tracing.py, if it is on
            head["traceparent"] = env.head.traceparent
            head["tracestate"] = env.head.tracestate
        admitted = Admitted(kind, corr, req, now, head, debug_time)
        if self.hooks is not None:
            return self.hooks.admitted(admitted, headers)
        return admitted

    async def dispatch(self, admitted: Admitted) -> Response:
        """The admitted request served: by the debug surface, the bounce tracker
        (``task.release``) or the engine."""
        kind, req = admitted.kind, admitted.req
        if kind.startswith("debug."):
            return await self.debug(kind, req, admitted.debug_time)
        if isinstance(req, rq.TaskRelease):
            return await self.release(req, admitted.now, admitted.head)
        return await self.engine.request(req, admitted.now, admitted.head, admitted.traced)

    def conclude(self, admitted: Admitted, response: Response) -> Answer:
        """What follows the engine's response: a worker's report remembered, a grant
        logged (after the commit, before the answer)."""
        kind, corr, req = admitted.kind, admitted.corr, admitted.req
        if type(req) in _REPORTS and isinstance(req, _WorkerReport):
            self.worker_reported(req, kind, corr, admitted.now, response)
        if response.status == 200 and type(req) in _GRANTS:
            log_grant(kind, corr, response)
        return kind, corr, response.status, response.data, admitted

    def failed(self, admitted: Admitted, exc: Exception) -> Answer:
        """The answer to a request whose serving raised ``exc``."""
        kind, corr = admitted.kind, admitted.corr
        if isinstance(exc, StoreFault):
            # Full, read-only, out of reach: logged once per episode (engine/health.py).
            return kind, corr, 503, str(exc), admitted
        if isinstance(exc, StoreUnavailable):
            # The database is down or restarting, or the batch lost every attempt to
            # concurrent writers: the request may be sent again (the message says
            # when a COMMIT broke off and its outcome is unknown).
            log.warning("store unavailable serving %s corrId=%s: %s", kind, corr, exc)
            return kind, corr, 503, f"Store unavailable: {exc}", admitted
        log.error("internal error serving %s corrId=%s", kind, corr, exc_info=exc)
        return kind, corr, 500, f"Internal error (corrId {corr}); nothing was changed", admitted

    def nats_answer(self, body: bytes, done: Callable[[Answer], None]) -> Answer | None:
        """A request from NATS: :meth:`answer_soon` with no transport headers (a NATS
        request authenticates with ``head.auth`` alone)."""
        return self.answer_soon(body, (), done)

    async def release(self, req: rq.TaskRelease, now: int, head: dict[str, Any]) -> Response:
        """``task.release``: a bounce of its task; after enough of them in a row, its
        re-emitted ``execute`` is held back (``server/bounces.py``)."""
        hold = self.bounces.hold(req.id, now)
        delay = 0 if hold is None else hold.delay_ms
        response, address = await self.engine.release(req, now, head, delay)
        if response.status == 200:
            self.bounces.bounced(req.id, now, hold, address)
            self.metrics.inc("troth_task_bounces_total")
            if hold is not None:
                self.metrics.inc("troth_task_backoffs_total")
                if self.delivery is not None:
                    # The loop sleeps until the earliest due row it last saw (at most
                    # a second); the held row may come due before that.
                    self.delivery.wake_here()
        return response

    def worker_reported(
        self, req: _WorkerReport, kind: str, corr: str, now: int, response: Response
    ) -> None:
        """What a worker's suspend, fulfil, fence or heartbeat says of its task:
        progress (a suspend or fulfil that was not refused) ends its bounce episode;
        a refusal is remembered, for the warning its backoff logs."""
        if response.status < 400:
            if isinstance(req, rq.TaskSuspend | rq.TaskFulfill):
                self.bounces.progressed(req.id)
            return
        refusal = Refusal(kind, response.status, str(response.data), corr)
        if isinstance(req, rq.TaskHeartbeat):
            for ref in req.tasks:
                self.bounces.refused(ref.id, now, refusal)
        else:
            self.bounces.refused(req.id, now, refusal)

    async def answer(self, send: Send, answer: Answer, started: float) -> None:
        kind, corr, status, data, _ = answer
        body = encode_response(kind, corr, status, data)
        await send_bytes(send, status, body, RETRY_AFTER if status == 503 else None)
        self.answered(answer, started)

    def choose_answered(self) -> Answered:
        """What :attr:`answered` is, chosen once (a hook may wrap it: tracing adds a
        span)."""
        plain = self.settings.log_format != "json"
        answered: Answered = self.answered_plain if plain else self.answered_json
        return answered if self.hooks is None else self.hooks.answered(answered)

    def answered_plain(self, answer: Answer, started: float, via: str = "") -> None:
        """Count and log one answered request (``via``: `` via=nats``, or nothing):
        :attr:`answered` unless the JSON log format is on."""
        seconds = time.perf_counter() - started
        kind, corr, status = answer[0], answer[1], answer[2]
        self.metrics.request(kind, status, seconds)
        access.info("%s corrId=%s status=%d ms=%.2f%s", kind, corr, status, seconds * 1000, via)

    def answered_json(self, answer: Answer, started: float, via: str = "") -> None:
        """:meth:`answered_plain` with the access line's fields for the JSON format
        (``server/logs.py``): the request's ids, the node."""
        seconds = time.perf_counter() - started
        kind, corr, status, _, admitted = answer
        self.metrics.request(kind, status, seconds)
        if access.isEnabledFor(logging.INFO):
            ids = () if admitted is None else request_ids(admitted.req)
            fields = access_fields(kind, corr, ids, status, seconds, self.node, via)
            access.info(
                "%s corrId=%s status=%d ms=%.2f%s",
                kind,
                corr,
                status,
                seconds * 1000,
                via,
                extra={FIELDS: fields},
            )

    # -- GET /poll/{group}/{id}: SSE ---------------------------------------------------

    async def poll(self, receive: Receive, send: Send, group: str, id: str) -> None:
        """Hold an SSE stream open for a worker: one ``data:`` line per message, LF
        framing, comment keep-alives (which also reveal a dead peer)."""
        try:
            conn = self.registry.connect(group, id)
        except Full as exc:
            status = 429 if exc.per_group else 503
            self.refusals.warning(
                "sse-group" if exc.per_group else "sse-node",
                "refused SSE connection for %s/%s: %s",
                group[:64],
                id[:64],
                exc,
            )
            await send_bytes(
                send,
                status,
                _json.encode({"error": f"Too many SSE connections: {exc}"}),
                [(b"retry-after", b"%d" % max(1, round(self.settings.keepalive)))],
            )
            return
        if self.cluster is not None:
            await self.cluster.connected()  # peers route this address here from now on
        else:
            await self.revive(group, id)
        await self.expedite(group)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        gone = asyncio.Event()

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    gone.set()
                    return

        # The peer leaving and the node closing rouse the writer (Connection.wake)
        # from its one wait; nothing is created per message.
        watcher = asyncio.create_task(watch())
        watcher.add_done_callback(lambda _: conn.wake())
        closing = asyncio.create_task(self.closing.wait())
        closing.add_done_callback(lambda _: conn.wake())
        if self.delivery is not None:
            self.delivery.wake_here()  # rows waiting for this address can go now
        try:
            await send(
                {"type": "http.response.body", "body": b": connected\n\n", "more_body": True}
            )
            while not gone.is_set() and not self.closing.is_set():
                await self.pump(conn, send, watcher)
        finally:
            self.registry.disconnect(conn)
            watcher.cancel()
            closing.cancel()
        if not gone.is_set():
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def pump(self, conn: Connection, send: Send, watcher: asyncio.Task[None]) -> None:
        """Write the next message, or a keep-alive when none came in time."""
        delivery = await conn.next(self.settings.keepalive)
        if delivery is None:
            if not watcher.done() and not self.closing.is_set():
                keepalive = b": keepalive\n\n"
                await send({"type": "http.response.body", "body": keepalive, "more_body": True})
            return
        if watcher.done():
            delivery.done.set_result(False)  # peer gone before the write: never left
            return
        try:
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + delivery.payload + b"\n\n",
                    "more_body": True,
                }
            )
        except BaseException as exc:
            delivery.done.set_exception(exc)
            raise
        delivery.done.set_result(True)

    async def revive(self, group: str, id: str) -> None:
        """A worker connected to a node of its own (SQLite, memory): what could not be
        delivered to its stream while it was away is offered again (``OutboxStore.
        revive``; a cluster does the same when a node publishes a stream).  The
        dispatcher is woken once the stream is set up (:meth:`poll`)."""
        if self.delivery is None:
            return
        group = group.lower()  # as the registry and poll:// addresses have it
        life = self.delivery.calls.life
        now = self.engine.clock()
        since = now - round(REVIVE_WINDOW * 1000)
        try:
            held, failed = await self.delivery.calls(lambda: life.revive(group, id, now, since))
        except Exception as exc:  # a courtesy: the retry timer re-emits what matters
            log.warning("could not offer again the messages for %s/%s: %s", group, id, exc)
            return
        if held or failed:
            log.info(
                "worker connected to %s/%s: %d messages that could not be delivered offered"
                " again (%d backed off, %d failed)",
                group[:64],
                id[:64],
                held + failed,
                held,
                failed,
            )

    async def expedite(self, group: str) -> None:
        """A worker of ``group`` connected: the tasks of that group held back by the
        bounce backoff are offered now (it may have the function the others lack)."""
        keys = self.bounces.expedite(group)
        if not keys or self.delivery is None:
            return
        life = self.delivery.calls.life
        try:
            n = await self.delivery.calls(lambda: life.expedite(keys))
        except Exception as exc:  # a courtesy: the rows come due by themselves anyway
            tasks = counted(len(keys), "task")
            log.warning("could not expedite %s of group %s: %s", tasks, group, exc)
            return
        if n:
            log.info("worker of group %s connected: %d backed-off tasks offered now", group, n)

    async def debug(self, kind: str, req: rq.Req, debug_time: int | None) -> Response:
        """The debug surface (only with ``--debug``): pause, reset, inspect, fire."""
        engine = self.engine
        if isinstance(req, rq.DebugTick):
            if debug_time is not None and debug_time != req.time:
                return Response(400, "debug.tick time must equal head resonate:debug_time")
            fired = await engine.tick(req.time)
            return Response(200, {"fired": fired})
        if kind == "debug.start":
            engine.pause()
        elif kind == "debug.stop":
            engine.resume()
        elif kind == "debug.reset":
            await engine.exclusive(engine.store.reset)
            engine.flow.load([])  # a reset store has no limits
            self.bounces.clear()
        elif kind == "debug.snap":
            return Response(200, await engine.exclusive(engine.store.snapshot))
        return Response(200, {})


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
    # Content-Length last: JsonHeads (server/direct.py) cuts a head there.
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


def nats_state(link: NatsLink | None) -> Callable[[], str]:
    """This node's NATS connection in a word, as ``troth explain`` reasons with it."""
    if link is None:
        return lambda: "off"
    return lambda: "connected" if link.connected else "disconnected"
