"""A real OTLP/HTTP trace receiver for the tracing tests: a local HTTP server that
takes ``POST /v1/traces``, decodes the protobuf ``ExportTraceServiceRequest`` with
the ``opentelemetry-proto`` package, and keeps every span it got."""

from __future__ import annotations

import gzip
import http.server
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from helpers.support import free_port


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status: str
    start_ns: int
    end_ns: int


@dataclass
class Receiver:
    url: str
    spans: list[Span] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def named(self, name: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.name == name]

    def all(self) -> list[Span]:
        """A copy of the spans received so far (the handler thread appends)."""
        with self.lock:
            return list(self.spans)

    def wait(self, what: str, check: Callable[[], bool], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.spans}"
            time.sleep(0.02)


def value(v: Any) -> Any:
    """An OTLP ``AnyValue`` as Python."""
    which = v.WhichOneof("value")
    if which == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs}


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    port = free_port()
    receiver = Receiver(f"http://127.0.0.1:{port}")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            got = []
            for rs in request.resource_spans:
                resource = attributes(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        got.append(
                            Span(
                                name=s.name,
                                trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(),
                                parent_id=s.parent_span_id.hex(),
                                kind=trace_pb2.Span.SpanKind.Name(s.kind),
                                attributes=attributes(s.attributes),
                                resource=resource,
                                status=trace_pb2.Status.StatusCode.Name(s.status.code),
                                start_ns=s.start_time_unix_nano,
                                end_ns=s.end_time_unix_nano,
                            )
                        )
            with receiver.lock:
                receiver.spans.extend(got)
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        httpd.shutdown()
        httpd.server_close()
