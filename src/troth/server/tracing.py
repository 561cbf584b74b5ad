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

Off by default, and then nothing of this module runs: the server builds
:class:`troth.server.app.App`, whose request path has no check for tracing at all;
this module, and OpenTelemetry with it, is imported only when tracing is on.  On, the
server builds :class:`TracedApp`, which extracts the parent in ``admit`` and makes
the request's span when it is answered, from the times already measured for the
access log (no span object lives while the request is served).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from troth import redact
from troth.machine.core import request_ids
from troth.outbox.rows import OutboxRow
from troth.outbox.types import Completed, Dispatched, OutboxSender
from troth.protocol.records import Execute
from troth.server import logs
from troth.server.app import Admitted, Answer, Answered, App
from troth.store.retention import Swept

log = logging.getLogger("troth.tracing")

#: The instrumentation scope of every span.
SCOPE = "troth"
_propagator = TraceContextTextMapPropagator()


class TracedAdmitted(Admitted):
    """An admitted request and the trace context its caller sent (None: a root)."""

    __slots__ = ("parent",)

    def __init__(self, admitted: Admitted, parent: Context | None) -> None:
        super().__init__(
            admitted.kind,
            admitted.corr,
            admitted.req,
            admitted.now,
            admitted.head,
            admitted.debug_time,
        )
        self.parent = parent


class Tracing:
    """One node's tracer provider and exporter, and the spans it makes."""

    def __init__(self, node: str, exporter: Any = None) -> None:
        resource = Resource.create({SERVICE_INSTANCE_ID: node})
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: "troth"}))
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer(SCOPE)
        self.node = node

    def parent(self, headers: Iterable[tuple[bytes, bytes]]) -> Context | None:
        """The context a ``traceparent`` (and ``tracestate``) header names, or None."""
        carrier: dict[str, str] = {}
        for name, value in headers:
            if name.lower() in (b"traceparent", b"tracestate"):
                carrier[name.decode("latin-1").lower()] = value.decode("latin-1")
        if "traceparent" not in carrier:
            return None
        context = _propagator.extract(carrier)
        # An unparsable traceparent yields an empty context: the span is a root.
        return context if trace.get_current_span(context).get_span_context().is_valid else None

    def request(self, answer: Answer, started: float, via: str) -> trace.Span:
        """The span of one answered request, begun when it arrived (``started``, the
        access log's clock) and not yet ended."""
        end = time.time_ns()
        start = end - int((time.perf_counter() - started) * 1e9)
        kind, corr, status, _, admitted = answer
        parent = admitted.parent if isinstance(admitted, TracedAdmitted) else None
        attributes: dict[str, Any] = {
            "troth.kind": kind,
            "troth.corr_id": corr,
            "troth.status": status,
            "troth.node": self.node,
        }
        if admitted is not None:
            attributes["troth.ids"] = list(request_ids(admitted.req))
        if via:
            attributes["troth.via"] = via.strip()
        span = self.tracer.start_span(
            kind, context=parent, kind=SpanKind.SERVER, attributes=attributes, start_time=start
        )
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR, f"status {status}"))
        return span

    def traced_answered(self, inner: Answered) -> Answered:
        """``App.answered`` that also records the request's span; the access line is
        logged inside it, so that the JSON format carries its trace and span ids."""

        def answered(answer: Answer, started: float, via: str = "") -> None:
            span = self.request(answer, started, via)
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
        with self.tracing.tracer.start_as_current_span(
            name, context=Context(), kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            outcome = await self.inner.send(row)
            span.set_attribute("troth.outcome", type(outcome).__name__.lower())
            code = getattr(outcome, "code", None)
            if code is not None:
                span.set_attribute("troth.code", code)
            if not isinstance(outcome, Completed):
                span.set_status(Status(StatusCode.ERROR, code or ""))
            return outcome


def inject(headers: dict[str, str]) -> None:
    """Put the current span's ``traceparent`` (and ``tracestate``) into ``headers``
    (the HTTP sender's hook)."""
    _propagator.inject(headers)


def current_ids() -> tuple[str, str] | None:
    """The current span's trace and span ids in hex (the JSON log format's hook)."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


class TracedApp(App):
    """:class:`App` with spans: the caller's trace context read in :meth:`admit`,
    the request's span made in :attr:`answered`."""

    def __init__(self, *args: Any, tracing: Tracing, **kwargs: Any) -> None:
        self.tracing = tracing
        super().__init__(*args, **kwargs)

    def choose_answered(self) -> Answered:
        return self.tracing.traced_answered(super().choose_answered())

    def admit(self, body: bytes, headers: Iterable[tuple[bytes, bytes]]) -> Answer | Admitted:
        got = super().admit(body, headers)
        if isinstance(got, Admitted):
            return TracedAdmitted(got, self.tracing.parent(headers))
        return got

    async def shutdown(self) -> None:
        was = self.started
        await super().shutdown()
        if was:
            await self.tracing.close()


def enable(node: str) -> Tracing:
    """Tracing for this process: the exporter from the standard variables, and trace
    ids in JSON log lines."""
    tracing = Tracing(node)
    logs.trace_ids = current_ids
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
