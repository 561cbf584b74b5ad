"""A workflow is one trace (server/tracing.py, docs/operations.md "Tracing"), on
each store: the trace context a request that created a promise ran in is kept with
the promise (``promises.trace``), and the requests and deliveries that act for it
later — without any ``traceparent`` of their own, as the published SDKs send them —
join it.  Driven over the wire as a worker would (acquire, fence a child, settle it,
fulfil), with the spans exported to a real OTLP/HTTP receiver."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jwt
import msgspec
import nats
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

pytest.importorskip(
    "opentelemetry.sdk", reason="tracing needs the otel extra: pip install -e '.[otel]'"
)

from helpers.hook import hook_server
from helpers.nats import nats_server
from helpers.otlp import Receiver, Span, otlp_receiver
from helpers.pg import throwaway_database
from helpers.support import VERSION, RunningServer, running_server
from troth.server.config import Settings

FAR = 10**13
#: A caller's own trace context, sent in the envelope's head (not a header).
HEAD_TRACE = "0af7651916cd43dd8448eb211c80319c"
HEAD_PARENT = "b7ad6b7169203331"

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    with otlp_receiver() as r:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        yield r


@contextmanager
def traced_server(store: str, tmp_path: Path) -> Iterator[RunningServer]:
    if store == "postgres":
        with (
            throwaway_database("troth_trace") as url,
            running_server(Settings(store="postgres", postgres_url=url, tracing=True)) as s,
        ):
            yield s
    elif store == "sqlite":
        with running_server(Settings(db=str(tmp_path / "t.db"), tracing=True)) as s:
            yield s
    else:
        with running_server(Settings(store="memory", tracing=True)) as s:
            yield s


def action(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "head": {"corrId": f"in-{kind}", "version": VERSION}, "data": data}


def one(receiver: Receiver, kind: str, id: str) -> Span:
    found = [s for s in receiver.named(kind) if s.attributes.get("troth.ids", [None])[0] == id]
    assert len(found) == 1, (kind, id, receiver.spans)
    return found[0]


@pytest.mark.parametrize("store", ["memory", "sqlite", "postgres"])
def test_a_workflow_is_one_trace(receiver: Receiver, store: str, tmp_path: Path) -> None:
    with hook_server() as hook, traced_server(store, tmp_path) as server:
        target = f"http://127.0.0.1:{hook.port}/run"
        tags = {"resonate:target": target, "resonate:origin": "wf"}
        server.ok("promise.create", {"id": "wf", "timeoutAt": FAR, "tags": tags})
        receiver.wait("the pushed execute", lambda: bool(hook.seen))
        task = hook.seen[0][1]["data"]["task"]
        assert task["id"] == "wf"
        version = task["version"]
        got = server.ok("task.acquire", {"id": "wf", "version": version, "pid": "w1", "ttl": 60000})
        version = got["task"]["version"]
        child = {
            "id": "wf.1",
            "timeoutAt": FAR,
            "tags": {"resonate:origin": "wf", "resonate:parent": "wf"},
        }
        fence = {"id": "wf", "version": version, "action": action("promise.create", child)}
        server.ok("task.fence", fence)
        server.ok("promise.settle", {"id": "wf.1", "state": "resolved", "value": {}})
        server.ok("promise.get", {"id": "wf.1"})
        settle = {"id": "wf", "state": "resolved", "value": {}}
        fulfil = {"id": "wf", "version": version, "action": action("promise.settle", settle)}
        server.ok("task.fulfill", fulfil)
        # A caller that sends its trace context in the envelope's head is continued.
        r = server.client.post(
            "/",
            json={
                "kind": "promise.create",
                "head": {
                    "corrId": "c-head",
                    "version": VERSION,
                    "traceparent": f"00-{HEAD_TRACE}-{HEAD_PARENT}-01",
                },
                "data": {"id": "other", "timeoutAt": FAR},
            },
        )
        assert r.json()["head"]["status"] == 200
        server.ok("promise.search", {"state": "pending"})
        receiver.wait("the fulfil's span", lambda: bool(receiver.named("task.fulfill")))
        receiver.wait("the search's span", lambda: bool(receiver.named("promise.search")))
        receiver.wait("the delivery's span", lambda: bool(receiver.named("deliver execute")))

    root = one(receiver, "promise.create", "wf")
    assert root.parent_id == "", "the workflow's first request starts its trace"
    deliver = receiver.named("deliver execute")[0]
    acquire = one(receiver, "task.acquire", "wf")
    fenced = one(receiver, "task.fence", "wf")
    settled = one(receiver, "promise.settle", "wf.1")
    read = one(receiver, "promise.get", "wf.1")
    fulfilled = one(receiver, "task.fulfill", "wf")
    # Every step of the workflow in the root's trace: what acts for the root under
    # the root's span, what acts for the child under the fence that created it.
    for span, parent in [
        (deliver, root),
        (acquire, root),
        (fenced, root),
        (fulfilled, root),
        (settled, fenced),
        (read, fenced),
    ]:
        assert (span.trace_id, span.parent_id) == (root.trace_id, parent.span_id), (
            span.name,
            parent.name,
        )
    # The push names the delivery's span, in the workflow's trace.
    assert hook.seen[0][0]["traceparent"] == f"00-{root.trace_id}-{deliver.span_id}-01"

    other = one(receiver, "promise.create", "other")
    assert (other.trace_id, other.parent_id) == (HEAD_TRACE, HEAD_PARENT)
    search = receiver.named("promise.search")[0]
    assert search.parent_id == "" and search.trace_id != root.trace_id


def test_a_node_that_did_not_see_the_creation_reads_the_trace(
    receiver: Receiver, tmp_path: Path
) -> None:
    """A second server on the same SQLite file (after the first stopped) has nothing
    in memory: the trace comes from the column."""
    db = str(tmp_path / "t.db")
    with running_server(Settings(db=db, tracing=True)) as server:
        server.ok("promise.create", {"id": "p", "timeoutAt": FAR})
    with running_server(Settings(db=db, tracing=True)) as server:
        server.ok("promise.settle", {"id": "p", "state": "resolved", "value": {}})
        receiver.wait("the settle's span", lambda: bool(receiver.named("promise.settle")))
    created, settled = one(receiver, "promise.create", "p"), one(receiver, "promise.settle", "p")
    assert (settled.trace_id, settled.parent_id) == (created.trace_id, created.span_id)


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_settle_in_the_creating_millisecond_keeps_the_creators_trace(
    receiver: Receiver, store: str, tmp_path: Path
) -> None:
    """A promise settled by another request in the millisecond it was created (the
    same ``now``) was created by the first request: the settle joins its trace and
    does not take the promise's stored trace for its own, so a read after both joins
    the creator's trace too."""
    db = str(tmp_path / "t.db") if store == "sqlite" else ":memory:"
    settings = Settings(store=store, db=db, tracing=True, debug=True)
    with running_server(settings) as server:
        server.ok("promise.create", {"id": "p", "timeoutAt": FAR}, now=1000)
        server.ok("promise.settle", {"id": "p", "state": "resolved", "value": {}}, now=1000)
        server.ok("promise.get", {"id": "p"}, now=1001)
        receiver.wait("the read's span", lambda: bool(receiver.named("promise.get")))
    created = one(receiver, "promise.create", "p")
    for kind in ("promise.settle", "promise.get"):
        span = one(receiver, kind, "p")
        assert (span.trace_id, span.parent_id) == (created.trace_id, created.span_id), kind


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_fenced_child_settled_in_its_creating_millisecond_keeps_the_fences_trace(
    receiver: Receiver, store: str, tmp_path: Path
) -> None:
    """The workflow above with its child settled in the millisecond the fence created
    it, as a fast worker does: the settle joins the fence and does not make the child
    its own, so the read after it joins the fence too (a read joined the settle while
    any promise a job wrote new at its instant counted as created by it)."""
    db = str(tmp_path / "t.db") if store == "sqlite" else ":memory:"
    settings = Settings(store=store, db=db, tracing=True, debug=True)
    with running_server(settings) as server:
        now = int(time.time() * 1000)  # a lease from now is not expired by the timer
        tags = {"resonate:target": "poll://any@g"}
        server.ok("promise.create", {"id": "wf", "timeoutAt": FAR, "tags": tags}, now=now)
        acquire = {"id": "wf", "version": 0, "pid": "w1", "ttl": 60000}
        version = server.ok("task.acquire", acquire, now=now + 1)["task"]["version"]
        child = {"id": "wf.1", "timeoutAt": FAR, "tags": {"resonate:parent": "wf"}}
        fence = {"id": "wf", "version": version, "action": action("promise.create", child)}
        server.ok("task.fence", fence, now=now + 2)
        settle = {"id": "wf.1", "state": "resolved", "value": {}}
        server.ok("promise.settle", settle, now=now + 2)
        server.ok("promise.get", {"id": "wf.1"}, now=now + 3)
        receiver.wait("the read's span", lambda: bool(receiver.named("promise.get")))
    fenced = one(receiver, "task.fence", "wf")
    for kind in ("promise.settle", "promise.get"):
        span = one(receiver, kind, "wf.1")
        assert (span.trace_id, span.parent_id) == (fenced.trace_id, fenced.span_id), kind


def test_tracing_off_stores_no_trace(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "t.db"
    with running_server(Settings(db=str(db))) as server:
        server.ok("promise.create", {"id": "p", "timeoutAt": FAR})
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            rows = sqlite3.connect(db).execute("SELECT id, trace FROM promises").fetchall()
            if rows:
                break
            time.sleep(0.05)
    assert rows == [("p", None)]


def test_nats_requests_and_refusals_have_spans(receiver: Receiver, tmp_path: Path) -> None:
    """A request over NATS is traced as one over HTTP (and joins the stored trace of
    the promise it names); a request refused before admission (401) has its span."""
    key = ed25519.Ed25519PrivateKey.generate()
    pub = tmp_path / "pub.pem"
    pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    token = jwt.encode({"exp": int(time.time()) + 3600, "prefix": "n"}, key, algorithm="EdDSA")

    async def ask(url: str, env: dict[str, Any]) -> dict[str, Any]:
        nc = await nats.connect(url)
        try:
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox, max_msgs=1)
            body = msgspec.json.encode(env)
            subject = "resonate.requests." + base64.urlsafe_b64encode(b"n1").rstrip(b"=").decode()
            await nc.publish(subject, body, headers={"Resonate-Reply-To": inbox})
            answer: dict[str, Any] = json.loads((await sub.next_msg(timeout=10)).data)
            return answer
        finally:
            await nc.close()

    with nats_server() as broker:
        settings = Settings(
            store="memory", tracing=True, nats_url=broker.url, auth_publickey=str(pub)
        )
        with running_server(settings) as server:
            receiver.wait(
                "the NATS subscription",
                lambda: getattr(server.app.nats, "sub", None) is not None,
            )
            head = {"corrId": "c-http", "version": VERSION, "auth": token}
            create = {"id": "n1", "timeoutAt": FAR}
            r = server.client.post(
                "/", json={"kind": "promise.create", "head": head, "data": create}
            )
            assert r.json()["head"]["status"] == 200
            env = {
                "kind": "promise.get",
                "head": {"corrId": "c-nats", "version": VERSION, "auth": token},
                "data": {"id": "n1"},
            }
            assert asyncio.run(ask(broker.url, env))["head"]["status"] == 200
            refused = {"corrId": "c-refused", "version": VERSION, "auth": "wrong"}
            r = server.client.post("/", json={"kind": "promise.get", "head": refused, "data": {}})
            assert r.json()["head"]["status"] == 401
            receiver.wait("three spans", lambda: len(receiver.named("promise.get")) >= 2)

    created = one(receiver, "promise.create", "n1")
    by_corr = {s.attributes["troth.corr_id"]: s for s in receiver.named("promise.get")}
    got = by_corr["c-nats"]
    assert got.attributes["troth.via"] == "via=nats origin=n1"
    assert (got.trace_id, got.parent_id) == (created.trace_id, created.span_id)
    refusal = by_corr["c-refused"]
    assert refusal.attributes["troth.status"] == 401 and refusal.parent_id == ""
    assert "troth.ids" not in refusal.attributes  # nothing of an unauthenticated request


def test_a_sampler_samples_whole_workflows(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``OTEL_TRACES_SAMPLER``: a workflow whose root is not sampled stores its
    context unsampled, so nothing that joins it later is exported either (no trace
    without its root); one whose caller sampled it is exported whole."""
    import sqlite3

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")  # no root is sampled
    db = tmp_path / "t.db"
    with hook_server() as hook, running_server(Settings(db=str(db), tracing=True)) as server:
        target = f"http://127.0.0.1:{hook.port}/run"
        server.ok(
            "promise.create", {"id": "wf", "timeoutAt": FAR, "tags": {"resonate:target": target}}
        )
        receiver.wait("the pushed execute", lambda: bool(hook.seen))
        version = hook.seen[0][1]["data"]["task"]["version"]
        server.ok("task.acquire", {"id": "wf", "version": version, "pid": "w", "ttl": 60000})
        r = server.client.post(
            "/",
            json={
                "kind": "promise.create",
                "head": {"corrId": "c-x", "version": VERSION},
                "data": {"id": "x", "timeoutAt": FAR},
            },
            headers={"traceparent": f"00-{HEAD_TRACE}-{HEAD_PARENT}-01"},
        )
        assert r.json()["head"]["status"] == 200
        server.ok("promise.get", {"id": "x"})
        receiver.wait("the sampled read", lambda: bool(receiver.named("promise.get")))
        traces = dict(sqlite3.connect(db).execute("SELECT id, trace FROM promises").fetchall())
    assert traces["wf"].endswith("-00") and traces["x"].endswith("-01"), traces
    # The push still names the (unsampled) trace, so a worker can continue it alike.
    assert hook.seen[0][0]["traceparent"].startswith(traces["wf"][:36])
    assert hook.seen[0][0]["traceparent"].endswith("-00")
    named = {tuple(s.attributes.get("troth.ids", ())) for s in receiver.spans}
    assert ("wf",) not in named, receiver.spans
    assert not receiver.named("deliver execute") and not receiver.named("task.acquire")
    created, read = one(receiver, "promise.create", "x"), one(receiver, "promise.get", "x")
    assert (read.trace_id, read.parent_id) == (HEAD_TRACE, created.span_id)
