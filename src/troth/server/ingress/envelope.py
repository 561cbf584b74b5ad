"""The one envelope handler shared by every ingress (HTTP ``POST /`` simple, parsed
by httptools or through ASGI; NATS): decode, auth, limits, then the engine's group
commit, the bounce tracker (``task.release``) or the debug surface — and what follows
the answer.  One pipeline (:meth:`Envelopes.answer_soon`); the ingresses are adapters.

Shared so that the ingresses cannot drift apart: a check added here holds for HTTP
and NATS alike.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, get_args

from troth.engine import Engine, Traced
from troth.machine.state import Response
from troth.protocol import requests as rq
from troth.protocol.envelope import EnvelopeError, decode_envelope
from troth.protocol.records import TaskRecord
from troth.protocol.requests import BadRequest, decode_data
from troth.server.config import Settings
from troth.server.delivery.bounces import BounceTracker, Refusal
from troth.server.delivery.loop import DeliveryLoop
from troth.server.ingress.auth import Authenticator, Denied, Grant, authorize
from troth.server.ingress.debug import debug
from troth.server.metrics import Metrics
from troth.store.base import Outcome
from troth.store.faults import StoreFault, StoreUnavailable

log = logging.getLogger("troth.server")
#: One line per granted ``task.acquire``, written before the answer leaves: an audit
#: trail of who held which task version (operators, and the multi-node tests).
grants = logging.getLogger("troth.grants")

#: What an envelope is answered with: ``(kind, corrId, status, data, admitted)``; the
#: last is the request as admitted, None for one refused before (what the JSON access
#: line and a trace span say of it: ``server/ingress/access.py``, ``server/tracing.py``).
Answer = tuple[str, str, int, object, "Admitted | None"]


@dataclass(slots=True)
class Admitted:
    """A request envelope that passed decoding, auth and the limits (:meth:`Envelopes.admit`)."""

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
    """What counts and logs one answered request (``server/ingress/access.py``)."""

    def __call__(self, answer: Answer, started: float, via: str = "") -> None: ...


class Hooks(Protocol):
    """What an observer adds to the request path, passed to the app rather than
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


#: Requests whose answer says something of a task's worker (:meth:`Envelopes.worker_reported`).
_WorkerReport = rq.TaskSuspend | rq.TaskFulfill | rq.TaskFence | rq.TaskHeartbeat
#: The same kinds as types, and those whose 200 grants a lease: a set lookup per
#: answer (~70 ns), not an ``isinstance`` over a union (~470 ns, and ``A | B`` in
#: the call made the union anew each time).
_REPORTS = frozenset(get_args(_WorkerReport))
_GRANTS = frozenset((rq.TaskAcquire, rq.TaskCreate))


def _settle(fut: asyncio.Future[Answer], answer: Answer) -> None:
    """Hand an answer to the coroutine awaiting it (gone, if its client went)."""
    if not fut.done():
        fut.set_result(answer)


class Envelopes:
    """Serves request envelopes for one :class:`Engine`, whichever way they came."""

    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        metrics: Metrics,
        bounces: BounceTracker,
        delivery: DeliveryLoop | None,
        auth: Authenticator | None,
        hooks: Hooks | None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.limits = settings.limits
        self.metrics = metrics
        #: Tasks that keep bouncing (server/delivery/bounces.py): event loop only.
        self.bounces = bounces
        self.delivery = delivery
        #: None unless tracing is on: each hook point then pays one ``is not None``.
        self.hooks = hooks
        #: None when auth is off: the hot path then pays one ``is not None``.
        self.auth = auth
        #: ``debug.*`` and ``task.release`` of :meth:`answer_soon` in progress (a task
        #: nothing else holds could be collected before it ends).
        self._tasks: set[asyncio.Future[Response]] = set()

    def answer_soon(
        self, body: bytes, headers: Iterable[tuple[bytes, bytes]], done: Callable[[Answer], None]
    ) -> Answer | None:
        """One request envelope, whichever way it came: decode, auth, limits (:meth:`admit`),
        then the engine's group commit, the bounce tracker (``task.release``) or the debug
        surface, then what follows the answer (:meth:`conclude`).  It never raises.

        Returns the answer, ``(kind, corrId, status, data, admitted)``, where nothing
        waits (a refusal, a point read), and ``done`` is not called; else None, and
        ``done`` is called with the answer when the request's batch committed — no task
        and no coroutine per request.  ``headers`` are the transport's (HTTP: the
        ``Authorization: Bearer`` fallback of auth); ``head.auth`` is read first.
        Every ingress is an adapter of this: a simple ``POST /``
        (``server/http/direct.py``), NATS (:meth:`nats_answer`), and ASGI
        (:meth:`envelope`)."""
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

    async def envelope(self, body: bytes, headers: Iterable[tuple[bytes, bytes]]) -> Answer:
        """:meth:`answer_soon` for a caller that awaits the answer (ASGI's ``POST /``)."""
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        answer = self.answer_soon(body, headers, functools.partial(_settle, fut))
        return answer if answer is not None else await fut

    def nats_answer(self, body: bytes, done: Callable[[Answer], None]) -> Answer | None:
        """A request from NATS: :meth:`answer_soon` with no transport headers (a NATS
        request authenticates with ``head.auth`` alone)."""
        return self.answer_soon(body, (), done)

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
        """An admitted request the engine's group commit does not serve alone: a
        ``debug.*`` one (the debug surface) or ``task.release`` (the bounce tracker)."""
        kind, req = admitted.kind, admitted.req
        if isinstance(req, rq.TaskRelease):
            return await self.release(req, admitted.now, admitted.head)
        return await debug(self.engine, self.bounces, kind, req, admitted.debug_time)

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

    async def release(self, req: rq.TaskRelease, now: int, head: dict[str, Any]) -> Response:
        """``task.release``: a bounce of its task; after enough of them in a row, its
        re-emitted ``execute`` is held back (``server/delivery/bounces.py``)."""
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
