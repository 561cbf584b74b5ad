"""OpenTelemetry traces (``tracing = true``; the ``troth[otel]`` extra).

Spans, exported over OTLP/HTTP to where the standard variables say
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``;
the service is ``troth`` unless they name it):

* one per protocol request (``SERVER``), named by its kind, with its ids, corrId,
  status and node; a W3C ``traceparent``/``tracestate`` on ``POST /`` makes it a
  child of the caller's span;
* one per delivery attempt (``CLIENT``: ``deliver execute``, ``deliver unblock``)
  with the address (without credentials), the outbox key, the attempt and its
  outcome and code; an HTTP push carries the attempt's ``traceparent`` to the worker;
* one per timer pass that fired (``timer``: how many steps, how late) and one per
  retention batch (``retention``: workflows and rows deleted).

A workflow is one trace (docs/operations.md, "Tracing").  The published SDKs send no
trace context, so the server keeps it: a request that creates promises stores its
own span's ``traceparent`` with each (``promises.trace``, a column the SDKs never
see), and a request that names a promise and brings no ``traceparent`` of its own
(in the HTTP headers or the envelope's ``head``) joins the trace stored with the
promise it acts for (:func:`anchors`) — a task's acquire, fence, suspend and fulfil
join the span that created the task's promise; children created by a fence join the
fence.  A delivery attempt's span is a child of the span that created the promise
it delivers for.  The stored context is read in the request's own job (its
transaction: the writer's, or a reader's) and remembered by the node
(:class:`Known`), so a workflow served by one node reads it once per promise.

Off by default, and then nothing of this module runs: the app has no hooks
(``App.hooks`` is None, one ``is not None`` per hook point) and this module, and
OpenTelemetry with it, is imported only when tracing is on.  On, :class:`Tracing` is
the app's hooks (``server/ingress/envelope.py``: ``Hooks``): it extracts the parent once a request
is admitted and makes the request's span when it is answered, from the times already
measured for the access log (no span object lives while the request is served).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision, ParentBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from troth import redact
from troth.machine.core import request_ids
from troth.outbox.rows import OutboxRow
from troth.outbox.types import Completed, Dispatched, OutboxSender
from troth.protocol import requests as rq
from troth.protocol.records import TAG_PARENT, Execute
from troth.protocol.requests import BadRequest, decode_data
from troth.server.ingress.envelope import Admitted, Answer, Answered
from troth.store.base import Overlay, ReadOnly, Store
from troth.store.retention import Swept

log = logging.getLogger("troth.tracing")

#: The instrumentation scope of every span.
SCOPE = "troth"
_propagator = TraceContextTextMapPropagator()


#: How many promises' trace contexts a node remembers (:class:`Known`).
KNOWN = 65536
_random = RandomIdGenerator()


def traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    """A W3C ``traceparent`` (flags: sampled or not)."""
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


#: Requests whose ``id`` is a schedule's, not a promise's.
_SCHEDULES = frozenset((rq.ScheduleGet, rq.ScheduleCreate, rq.ScheduleDelete))


def anchors(req: rq.Req) -> tuple[str, ...]:
    """The promises whose stored trace a request joins when its caller sent none,
    first found first: the task a task request acts for (a task's id is its
    promise's), the promise a promise request names — and for a create, the
    ``resonate:parent`` its tags name (a child created without a fence).  A
    heartbeat joins its task's trace only when it names one task: it is the SDK
    process's, for every task it holds."""
    if isinstance(req, rq.PromiseRegisterCallback):
        return (req.awaiter, req.awaited)
    if isinstance(req, rq.PromiseRegisterListener):
        return (req.awaited,)
    if isinstance(req, rq.TaskHeartbeat):  # a process's, for all of its tasks
        return (req.tasks[0].id,) if len(req.tasks) == 1 else ()
    tags: Mapping[str, str] | None = None
    if isinstance(req, rq.PromiseCreate):
        tags = req.tags
    elif isinstance(req, rq.TaskCreate) and req.action.kind == "promise.create":
        try:
            inner = decode_data("promise.create", req.action.data)
        except BadRequest:
            return ()
        if isinstance(inner, rq.PromiseCreate):
            req, tags = inner, inner.tags
    id = getattr(req, "id", None)
    if not isinstance(id, str) or type(req) in _SCHEDULES:
        return ()
    parent = tags.get(TAG_PARENT) if tags else None
    if isinstance(parent, str) and parent != id:
        return (id, parent)
    return (id,)


class Known:
    """The trace contexts a node has stored or read, by promise id, the oldest
    forgotten first beyond :data:`KNOWN`: a workflow on one node reads each from the
    store once.  Written on the event loop only; the writer thread only reads it."""

    def __init__(self, limit: int = KNOWN) -> None:
        self.limit = limit
        self.traces: dict[str, str] = {}

    def get(self, id: str) -> str | None:
        return self.traces.get(id)

    def put(self, id: str, trace: str) -> None:
        traces = self.traces
        traces[id] = trace
        if len(traces) > self.limit:
            del traces[next(iter(traces))]


class PresetIds(IdGenerator):
    """Random ids, except for the next span when the server chose its ids before the
    span was made: a request's span id is in the trace contexts its job stored."""

    def __init__(self) -> None:
        self.span_id = 0
        self.trace_id = 0

    def preset(self, trace_id: int, span_id: int) -> None:
        self.trace_id, self.span_id = trace_id, span_id

    def clear(self) -> None:
        self.trace_id = self.span_id = 0

    def generate_span_id(self) -> int:
        return self.span_id or _random.generate_span_id()

    def generate_trace_id(self) -> int:
        return self.trace_id or _random.generate_trace_id()


class TracedAdmitted(Admitted):
    """An admitted request with its trace: the context its caller sent (None: none),
    the ids its span will have, and what its job found and wrote (:meth:`joined`,
    ``wrote``: set on the writer or a reader thread, read on the event loop after
    the job's outcome was delivered)."""

    __slots__ = ("joined", "own", "parent", "ran", "span_id", "trace_id", "wrote")

    def __init__(self, admitted: Admitted, parent: Context | None, tracing: Tracing) -> None:
        super().__init__(
            admitted.kind,
            admitted.corr,
            admitted.req,
            admitted.now,
            admitted.head,
            admitted.debug_time,
            functools.partial(tracing.resolve, self),
        )
        self.parent = parent
        if parent is not None:
            self.trace_id = trace.get_current_span(parent).get_span_context().trace_id
        else:
            self.trace_id = _random.generate_trace_id()
        self.span_id = _random.generate_span_id()
        #: ``(promise id, traceparent)``: the stored trace the request joined.
        self.joined: tuple[str, str] | None = None
        #: Promises the job created, which keep this request's span (``own``) as
        #: their trace.
        self.wrote: tuple[str, ...] = ()
        self.own = ""
        #: When its job ran in the store (``perf_counter``; 0: it had none).
        self.ran = 0.0


class Tracing:
    """One node's tracer provider and exporter, and the spans it makes."""

    def __init__(
        self,
        node: str,
        exporter: Any = None,
        lookup: Callable[[str], Awaitable[str | None]] | None = None,
    ) -> None:
        resource = Resource.create({SERVICE_INSTANCE_ID: node})
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: "troth"}))
        self.ids = PresetIds()
        self.provider = TracerProvider(resource=resource, id_generator=self.ids)
        #: Whether the sampler follows the parent's flag (the default, and what a
        #: workflow sampled whole needs): unsampled requests then make no span.
        self.parent_based = isinstance(self.provider.sampler, ParentBased)
        self.provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer(SCOPE)
        self.node = node
        self.known = Known()
        #: Reads a promise's stored trace off the request path (a delivery of a
        #: promise this node has not seen): :func:`reader` over the node's store.
        self.lookup = lookup

    def parent(
        self, headers: Iterable[tuple[bytes, bytes]], head: Mapping[str, Any]
    ) -> Context | None:
        """The context a ``traceparent`` (and ``tracestate``) names — the HTTP
        header's, else the envelope head's — or None."""
        carrier: dict[str, str] = {}
        for name, value in headers:
            if name.lower() in (b"traceparent", b"tracestate"):
                carrier[name.decode("latin-1").lower()] = value.decode("latin-1")
        if "traceparent" not in carrier:
            sent = head.get("traceparent")
            if not isinstance(sent, str):
                return None
            carrier["traceparent"] = sent
            state = head.get("tracestate")
            if isinstance(state, str):
                carrier["tracestate"] = state
        return _context(carrier)

    def resolve(self, admitted: TracedAdmitted, tx: Overlay) -> None:
        """In the request's job, after the machine (``Engine.submit``'s ``traced``):
        the stored trace the request joins, when its caller sent none, and this
        request's own span as the trace of each promise the job created.  A job that
        runs again (a PostgreSQL batch re-run) finds and writes the same."""
        admitted.ran = time.perf_counter()
        if admitted.parent is None:
            known, backend = self.known, tx.backend
            self._join(admitted, lambda id: known.get(id) or backend.get_trace(id))
        if isinstance(tx, ReadOnly) or not tx.writes.promises:
            return
        now, backend = admitted.now, tx.backend
        # Created by this job: new at this instant *and* absent before it.  A promise
        # another request created in the same millisecond, settled or updated here,
        # keeps the trace it was created in.
        created = [
            id
            for id, p in tx.writes.promises.items()
            if p.created_at == now and backend.get_promise(id) is None
        ]
        if created:
            admitted.own = traceparent(admitted.trace_id, admitted.span_id, self.sampled(admitted))
            tx.writes.traces = dict.fromkeys(created, admitted.own)
            admitted.wrote = tuple(created)

    def sampled(self, admitted: TracedAdmitted) -> bool:
        """Whether the request's span will be sampled, decided as the tracer will
        decide it (``OTEL_TRACES_SAMPLER``; by default every span): the flag its
        stored context carries, so that what joins it later is sampled alike and a
        sampled trace has no unsampled root, nor an unsampled one sampled children."""
        if admitted.parent is None and admitted.joined is not None:
            return admitted.joined[1].endswith("1")
        return self.will_sample(admitted.parent or Context(), admitted.trace_id, admitted.kind)

    def will_sample(self, parent: Context, trace_id: int, name: str) -> bool:
        """What a parent-based sampler decides for a span in ``parent``: its parent's
        flag, or for a root the root sampler's decision on ``trace_id``."""
        context = trace.get_current_span(parent).get_span_context()
        if context.is_valid:
            return context.trace_flags.sampled
        return self._root_sampled(trace_id, name)

    def _root_sampled(self, trace_id: int, name: str) -> bool:
        result = self.provider.sampler.should_sample(None, trace_id, name)
        return result.decision is Decision.RECORD_AND_SAMPLE

    @staticmethod
    def _join(admitted: TracedAdmitted, lookup: Callable[[str], str | None]) -> None:
        """The first of the request's anchors with a stored trace (``lookup``) is the
        trace it joins."""
        for id in anchors(admitted.req):
            stored = lookup(id)
            if stored is not None and _TRACEPARENT.fullmatch(stored):
                admitted.joined = (id, stored)
                admitted.trace_id = int(stored[3:35], 16)
                return

    def context_of(self, admitted: TracedAdmitted) -> Context:
        """The context a request's span is made in: its caller's, or the stored trace
        it joined (its job's; or, for a request whose job has no trace step — a
        ``task.release`` — what this node remembers), or none (a root)."""
        if admitted.parent is not None:
            return admitted.parent
        if admitted.joined is None and not admitted.wrote:
            self._join(admitted, self.known.get)
        if admitted.joined is None:
            return Context()
        return _context({"traceparent": admitted.joined[1]}) or Context()

    def request(self, answer: Answer, started: float, via: str) -> trace.Span | None:
        """The span of one answered request, begun when it arrived (``started``, the
        access log's clock) and not yet ended; None for a request of a trace that is
        not sampled (a parent-based sampler would make it a span that records
        nothing: ~11 µs a request for nothing, docs/benchmarks.md "Tracing")."""
        end = time.time_ns()
        start = end - int((time.perf_counter() - started) * 1e9)
        kind, corr, status, _, admitted = answer
        parent = Context()
        if isinstance(admitted, TracedAdmitted):
            parent = self.context_of(admitted)
            known = self.known
            if admitted.joined is not None:
                known.put(*admitted.joined)
            if admitted.wrote and status < 500:
                for id in admitted.wrote:
                    known.put(id, admitted.own)
            if self.parent_based and not self.will_sample(parent, admitted.trace_id, kind):
                return None
            self.ids.preset(admitted.trace_id, admitted.span_id)
        attributes: dict[str, Any] = {
            "troth.kind": kind,
            "troth.corr_id": corr,
            "troth.status": status,
            "troth.node": self.node,
        }
        if admitted is not None:
            attributes["troth.ids"] = list(request_ids(admitted.req))
        if isinstance(admitted, TracedAdmitted) and admitted.ran:
            # Queued (arrival → its job ran in a batch) and in the store (→ the
            # batch committed and the answer was back on the event loop).
            attributes["troth.queue_ms"] = round((admitted.ran - started) * 1000, 3)
            attributes["troth.store_ms"] = round((time.perf_counter() - admitted.ran) * 1000, 3)
        if via:
            attributes["troth.via"] = via.strip()
        try:
            span = self.tracer.start_span(
                kind, context=parent, kind=SpanKind.SERVER, attributes=attributes, start_time=start
            )
        finally:
            self.ids.clear()
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR, f"status {status}"))
        return span

    def admitted(
        self, admitted: Admitted, headers: Iterable[tuple[bytes, bytes]]
    ) -> TracedAdmitted:
        """The app's hook after ``Envelopes.admit``: the request with its caller's trace
        context (``headers``, else the envelope's head) and its span's ids."""
        return TracedAdmitted(admitted, self.parent(headers, admitted.head), self)

    def answered(self, inner: Answered) -> Answered:
        """The app's hook on ``App.answered``: it also records the request's span; the
        access line is logged inside it, so that the JSON format carries its trace and
        span ids."""

        def answered(answer: Answer, started: float, via: str = "") -> None:
            span = self.request(answer, started, via)
            if span is None:
                inner(answer, started, via)
                return
            end = time.time_ns()
            try:
                with trace.use_span(span, end_on_exit=False):
                    inner(answer, started, via)
            finally:
                span.end(end_time=end)

        return answered

    def timer(self, lag_ms: int, fired: int, seconds: float) -> None:
        """One timer pass that fired due internal steps (``Engine.on_timer``)."""
        self._done(
            "timer",
            seconds,
            {"troth.timer.fired": fired, "troth.timer.lag_ms": lag_ms, "troth.node": self.node},
        )

    def retention(self, swept: Swept, seconds: float) -> None:
        """One retention batch (``RetentionLoop.on_batch``)."""
        self._done(
            "retention",
            seconds,
            {
                "troth.retention.workflows": swept.trees,
                "troth.retention.promises": swept.promises,
                "troth.retention.tasks": swept.tasks,
                "troth.retention.outbox": swept.outbox,
                "troth.node": self.node,
            },
        )

    def _done(self, name: str, seconds: float, attributes: Mapping[str, Any]) -> None:
        end = time.time_ns()
        span = self.tracer.start_span(
            name, context=Context(), attributes=attributes, start_time=end - int(seconds * 1e9)
        )
        span.end(end_time=end)

    def sender(self, inner: OutboxSender) -> OutboxSender:
        return TracedSender(self, inner)

    async def close(self) -> None:
        """Export what is buffered, then stop (a blocking HTTP call: off the loop)."""
        await asyncio.to_thread(self.provider.shutdown)


class TracedSender:
    """A transport's sender with a span per delivery attempt; while it runs the
    attempt's span is current, so the HTTP sender's ``traceparent`` names it."""

    def __init__(self, tracing: Tracing, inner: OutboxSender) -> None:
        self.tracing = tracing
        self.inner = inner

    async def send(self, row: OutboxRow) -> Dispatched:
        message = row.message
        id = message.task_id if isinstance(message, Execute) else message.promise.id
        tracing = self.tracing
        stored = tracing.known.get(id)
        if stored is None and tracing.lookup is not None:
            try:
                stored = await tracing.lookup(id)
            except Exception as exc:  # the delivery goes ahead, as a root span
                log.debug("could not read the trace of %s: %s", id, exc)
            if stored is not None:
                tracing.known.put(id, stored)
        parent = Context()
        if stored is not None:
            parent = _context({"traceparent": stored}) or parent
        attributes: dict[str, Any] = {
            "troth.address": redact.url(row.address),
            "troth.outbox.key": row.key,
            "troth.outbox.attempt": row.attempts + 1,
            "troth.node": self.tracing.node,
        }
        if isinstance(message, Execute):
            name = "deliver execute"
            attributes["troth.task.id"] = message.task_id
            attributes["troth.task.version"] = message.version
        else:
            name = "deliver unblock"
            attributes["troth.promise.id"] = message.promise.id
        with tracing.tracer.start_as_current_span(
            name, context=parent, kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            outcome = await self.inner.send(row)
            span.set_attribute("troth.outcome", type(outcome).__name__.lower())
            code = getattr(outcome, "code", None)
            if code is not None:
                span.set_attribute("troth.code", code)
            if not isinstance(outcome, Completed):
                span.set_status(Status(StatusCode.ERROR, code or ""))
            return outcome


#: A ``traceparent`` as this server writes it (version 00, lowercase hex).
_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def _context(carrier: Mapping[str, str]) -> Context | None:
    """The context a W3C carrier names, or None when it does not parse (the span is
    then a root)."""
    context = _propagator.extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def inject(headers: dict[str, str]) -> None:
    """Put the current span's ``traceparent`` (and ``tracestate``) into ``headers``
    (the HTTP sender's hook)."""
    _propagator.inject(headers)


def current_ids() -> tuple[str, str] | None:
    """The current span's trace and span ids in hex (the JSON log format's
    ``trace_ids``, ``server/logs.py``)."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def reader(store: Store) -> Callable[[str], Awaitable[str | None]]:
    """:attr:`Tracing.lookup` over ``store``: a read snapshot of its own, in a thread
    (``Store.inspect``), never the writer's."""

    async def lookup(id: str) -> str | None:
        return await asyncio.to_thread(store.inspect, lambda view: view.trace(id))

    return lookup


def enable(node: str, store: Store) -> Tracing:
    """Tracing for this process: the exporter from the standard variables, and stored
    traces read from ``store`` off the request path.  (Trace ids in JSON log lines
    are the formatter's, given :func:`current_ids` when logging is configured:
    ``server/run.configure_logging``.)"""
    tracing = Tracing(node, lookup=reader(store))
    log.info(
        "tracing on: spans to %s as service %s",
        redact.url(
            os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            or "http://localhost:4318"
        ),
        tracing.provider.resource.attributes.get(SERVICE_NAME),
    )
    return tracing
