"""OpenTelemetry traces (server/tracing.py), exported to a real OTLP/HTTP receiver
started here (tests/helpers/otlp.py decodes the protobuf with opentelemetry-proto).

A request's span continues the caller's W3C ``traceparent``; a delivery attempt has
a span of its own whose context an HTTP push carries to the worker; timer passes
and retention batches have spans; the exporter is configured by the standard
``OTEL_*`` variables; a JSON log line names the trace and span of its request.  With
tracing off, OpenTelemetry is not even imported.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip(
    "opentelemetry.sdk", reason="tracing needs the otel extra: pip install -e '.[otel]'"
)

from helpers.hook import hook_server
from helpers.otlp import Receiver, Span, otlp_receiver
from helpers.serve_process import serve
from helpers.support import VERSION, running_server
from troth.server.config import Settings
from troth.server.tracing import Tracing

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"
FAR = 10**13


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    with otlp_receiver() as r:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "troth-under-test")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        yield r


def envelope(kind: str, corr: str, data: object) -> dict[str, object]:
    return {"kind": kind, "head": {"corrId": corr, "version": VERSION}, "data": data}


def tree(spans: list[Span]) -> str:
    """The spans of one trace as an indented tree (printed when a test fails)."""
    children: dict[str, list[Span]] = {}
    for s in spans:
        children.setdefault(s.parent_id, []).append(s)
    ids = {s.span_id for s in spans}
    lines: list[str] = []

    def walk(span: Span, depth: int) -> None:
        lines.append(f"{'  ' * depth}{span.name} [{span.kind}] {span.attributes}")
        for child in children.get(span.span_id, []):
            walk(child, depth + 1)

    for s in spans:
        if s.parent_id not in ids:
            walk(s, 0)
    return "\n".join(lines)


@pytest.mark.timeout(60)
def test_requests_deliveries_timer_and_retention_have_spans(receiver: Receiver) -> None:
    settings = Settings(store="memory", tracing=True, retention="1s", retention_interval=0.1)
    with hook_server() as hook, running_server(settings) as server:
        assert isinstance(server.app.hooks, Tracing)
        target = {"resonate:target": f"http://127.0.0.1:{hook.port}/run"}
        r = server.client.post(
            "/",
            json=envelope("promise.create", "c-wf", {"id": "wf", "timeoutAt": FAR, "tags": target}),
            headers={"traceparent": TRACEPARENT, "tracestate": "vendor=1"},
        )
        assert r.json()["head"]["status"] == 200
        soon = int(time.time() * 1000) + 300
        server.ok("promise.create", {"id": "soon", "timeoutAt": soon})
        r = server.client.post(
            "/",
            json=envelope("promise.get", "c-bad", {"id": "wf"}),
            headers={"traceparent": "00-not-a-trace"},
        )
        assert r.json()["head"]["status"] == 200
        receiver.wait("the pushed execute", lambda: bool(hook.seen))
        receiver.wait("a delivery span", lambda: bool(receiver.named("deliver execute")))
        receiver.wait("a timer span", lambda: bool(receiver.named("timer")))
        receiver.wait("a retention span", lambda: bool(receiver.named("retention")))
        receiver.wait("the request spans", lambda: len(receiver.named("promise.create")) >= 2)

    created = [
        s for s in receiver.named("promise.create") if s.attributes["troth.corr_id"] == "c-wf"
    ]
    assert len(created) == 1, tree(receiver.spans)
    request = created[0]
    # The caller's trace, continued: same trace id, the caller's span as parent.
    assert (request.trace_id, request.parent_id) == (TRACE, PARENT)
    assert request.kind == "SPAN_KIND_SERVER"
    assert request.attributes["troth.ids"] == ["wf"]
    assert request.attributes["troth.status"] == 200
    assert request.attributes["troth.kind"] == "promise.create"
    # Where its time went: queued for a batch, then in the store until answered.
    queue, store = request.attributes["troth.queue_ms"], request.attributes["troth.store_ms"]
    assert queue >= 0 and store > 0
    assert (queue + store) * 1e6 <= request.end_ns - request.start_ns + 1e6
    assert request.resource["service.name"] == "troth-under-test"
    assert request.end_ns > request.start_ns

    # A traceparent that does not parse is ignored: the read joins the trace the
    # promise was created in, under the span that created it.
    (bad,) = [s for s in receiver.named("promise.get") if s.attributes["troth.corr_id"] == "c-bad"]
    assert (bad.trace_id, bad.parent_id) == (TRACE, request.span_id)

    # The delivery attempt's context travels to the worker with the push; the
    # attempt is a child of the span that created the promise.
    deliver = receiver.named("deliver execute")[0]
    assert (deliver.trace_id, deliver.parent_id) == (TRACE, request.span_id)
    assert deliver.kind == "SPAN_KIND_CLIENT"
    assert deliver.attributes["troth.task.id"] == "wf"
    assert deliver.attributes["troth.outcome"] == "completed"
    assert deliver.attributes["troth.outbox.attempt"] == 1
    assert deliver.attributes["troth.address"] == f"http://127.0.0.1:{hook.port}/run"
    headers = hook.seen[0][0]
    version, trace_id, parent_id, flags = headers["traceparent"].split("-")
    assert (version, trace_id, parent_id) == ("00", deliver.trace_id, deliver.span_id)
    assert int(flags, 16) & 1  # sampled

    timer = receiver.named("timer")[0]
    assert timer.attributes["troth.timer.fired"] >= 1
    assert "troth.retention.workflows" in receiver.named("retention")[0].attributes


@pytest.mark.timeout(60)
def test_a_failed_delivery_is_an_error_span(receiver: Receiver) -> None:
    settings = Settings(store="memory", tracing=True, max_attempts=1)
    with hook_server() as hook, running_server(settings) as server:
        hook.status[0] = 404
        target = {"resonate:target": f"http://127.0.0.1:{hook.port}/run"}
        server.ok("promise.create", {"id": "nf", "timeoutAt": FAR, "tags": target})
        receiver.wait("a delivery span", lambda: bool(receiver.named("deliver execute")))
    deliver = receiver.named("deliver execute")[0]
    assert deliver.status == "STATUS_CODE_ERROR"
    assert deliver.attributes["troth.outcome"] == "permanent"
    assert deliver.attributes["troth.code"].endswith("404")


@pytest.mark.timeout(60)
def test_json_log_lines_name_the_request_trace(tmp_path: Path) -> None:
    """``troth serve --tracing --log-format json`` configured by the OTEL_* variables
    alone: the access line carries the trace and span ids of the request's span."""
    with otlp_receiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_SERVICE_NAME": "troth-json",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        }
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        log = tmp_path / "log"
        try:
            args = ["serve", "--db", "t.db", "--tracing", "--log-format", "json"]
            with serve(args, tmp_path, log) as (proc, url):
                r = httpx.post(
                    f"{url}/",
                    json=envelope("promise.create", "c-json", {"id": "j", "timeoutAt": FAR}),
                    headers={"traceparent": TRACEPARENT},
                )
                assert r.json()["head"]["status"] == 200
                receiver.wait("the request span", lambda: bool(receiver.named("promise.create")))
                proc.send_signal(signal.SIGTERM)
                proc.wait(15)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    span = receiver.named("promise.create")[0]
    assert span.resource["service.name"] == "troth-json"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    (access,) = [x for x in lines if x.get("corrId") == "c-json"]
    assert (access["traceId"], access["spanId"]) == (TRACE, span.span_id)
    assert any(x["message"].startswith("tracing on: spans to") for x in lines)


def test_with_tracing_off_opentelemetry_is_not_imported(tmp_path: Path) -> None:
    """Off (the default), the server is the plain App and never imports
    OpenTelemetry: the request path has nothing of tracing to pay for."""
    program = """
import sys
from helpers.support import running_server
from troth.server.http.app import App
from troth.server.config import Settings
with running_server(Settings(store="memory")) as server:
    assert type(server.app) is App and server.app.hooks is None
    server.ok("promise.create", {"id": "p", "timeoutAt": 10**13})
    server.ok("promise.get", {"id": "p"})
loaded = sorted(m for m in sys.modules if m.startswith(("opentelemetry", "troth.server.tracing")))
assert not loaded, loaded
print("ok")
"""
    tests = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tests)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
