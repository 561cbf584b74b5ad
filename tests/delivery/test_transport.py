"""Transports over real sockets: SSE (``GET /poll/{group}/{id}``) and HTTP push.

The SSE reader here is deliberately as strict as the Python SDK's parser: events are
separated by a blank line with LF only, every ``data:`` line is one JSON message.
"""

from __future__ import annotations

import asyncio
import queue
import time

import pytest

from helpers.hook import hook_server
from helpers.sse import stream
from helpers.support import RunningServer, free_port, running_server, wait_for
from troth.outbox.rows import OutboxRow
from troth.outbox.types import Completed, Permanent, Retryable, Unknown
from troth.protocol.address import PollAddress, parse_poll
from troth.protocol.records import Execute, OutboxEntry
from troth.server.config import Settings
from troth.transport.http import HttpSender, classify

FAR = 10**13


@pytest.fixture
def live(server: RunningServer) -> RunningServer:
    """A debug server whose timer and delivery run (``debug.stop`` resumes them)."""
    server.ok("debug.stop", {})
    return server


def test_execute_arrives_over_sse_with_lf_framing(live: RunningServer) -> None:
    with stream(live, "g", "w1") as s:
        live.ok(
            "promise.create",
            {"id": "wf", "timeoutAt": FAR, "tags": {"resonate:target": "poll://any@g"}},
        )
        message = s.next()
    assert message == {
        "kind": "execute",
        "head": {"serverUrl": live.settings.url},
        "data": {"task": {"id": "wf", "version": 0}},
    }
    assert b"\r" not in s.raw
    assert b'data: {"kind":"execute"' in s.raw


def test_unblock_goes_to_the_listener_address_only(live: RunningServer) -> None:
    with stream(live, "g", "a") as a, stream(live, "g", "b") as b:
        live.ok(
            "promise.create", {"id": "p", "timeoutAt": FAR, "tags": {"resonate:external": "true"}}
        )
        live.ok("promise.register_listener", {"awaited": "p", "address": "poll://uni@g/b"})
        live.ok("promise.settle", {"id": "p", "state": "resolved", "value": {"data": "eA=="}})
        message = b.next()
        assert message["kind"] == "unblock"
        assert message["head"] == {}
        assert message["data"]["promise"]["id"] == "p"
        assert message["data"]["promise"]["state"] == "resolved"
        assert message["data"]["promise"]["value"] == {"data": "eA=="}
        with pytest.raises(queue.Empty):
            a.next(timeout=0.3)


def test_anycast_prefers_the_named_id_and_falls_back_to_the_group(live: RunningServer) -> None:
    with stream(live, "g", "a") as a, stream(live, "g", "b") as b:
        tags = {"resonate:target": "poll://any@g/b"}
        live.ok("promise.create", {"id": "t1", "timeoutAt": FAR, "tags": tags})
        assert b.next()["data"]["task"]["id"] == "t1"
        tags = {"resonate:target": "poll://any@g/nobody"}
        live.ok("promise.create", {"id": "t2", "timeoutAt": FAR, "tags": tags})
        got: list[str] = []
        for s in (a, b):
            try:
                got.append(s.next(timeout=1)["data"]["task"]["id"])
            except queue.Empty:
                pass
        assert got == ["t2"]


def test_no_connection_is_retried_and_delivered_when_a_worker_arrives(live: RunningServer) -> None:
    tags = {"resonate:target": "poll://uni@g/late"}
    live.ok("promise.create", {"id": "t", "timeoutAt": FAR, "tags": tags})
    deadline = time.monotonic() + 5
    while True:
        rows = [r for r in live.snap()["outbox"] if r["key"] == "t"]
        if rows and rows[0]["attempts"] >= 1:
            break
        assert time.monotonic() < deadline, rows
        time.sleep(0.02)
    assert rows[0]["state"] == "pending"
    assert rows[0]["lastCode"] == "troth.poll.no_connection"
    with stream(live, "g", "late") as s:
        assert s.next(timeout=8)["data"]["task"]["id"] == "t"


def test_keepalive_comments_flow_on_an_idle_stream() -> None:
    settings = Settings(store="memory", debug=True, keepalive=0.1, access_log=False)
    with running_server(settings) as server, stream(server, "g", "idle") as s:
        # One each 0.1 s: three within the deadline (the default, 5 s, would give none).
        wait_for("three keep-alive comments", lambda: s.raw.count(b": keepalive\n\n") >= 3, 4)


def sse_gauge(server: RunningServer) -> int:
    for line in server.client.get("/metrics").text.splitlines():
        if line.startswith("troth_sse_connections "):
            return int(float(line.split()[1]))
    raise AssertionError("no troth_sse_connections gauge")


def test_several_connections_per_id_and_the_gauge(live: RunningServer) -> None:
    base = sse_gauge(live)
    with stream(live, "g", "same") as first, stream(live, "g", "same") as second:
        assert sse_gauge(live) == base + 2
        tags = {"resonate:target": "poll://uni@g/same"}
        live.ok("promise.create", {"id": "t", "timeoutAt": FAR, "tags": tags})
        got = []
        for s in (first, second):
            try:
                got.append(s.next(timeout=1)["data"]["task"]["id"])
            except queue.Empty:
                pass
        assert got == ["t"]  # one copy, to one of the connections
    deadline = time.monotonic() + 5
    while sse_gauge(live) != base:  # closed streams are noticed and dropped
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_poll_address_parsing() -> None:
    assert parse_poll("poll://uni@G/w") == PollAddress("uni", "g", "w")
    assert parse_poll("poll://any@g") == PollAddress("any", "g", None)
    assert parse_poll("poll://any@g/w") == PollAddress("any", "g", "w")
    for bad in ("poll://uni@g", "poll://x@g/w", "poll://g", "http://x", "poll://any@"):
        assert parse_poll(bad) is None, bad


# --------------------------------------------------------------------- HTTP push


def test_http_push_posts_the_message_with_its_idempotency_key(live: RunningServer) -> None:
    with hook_server() as hook:
        target = f"http://127.0.0.1:{hook.port}/run"
        live.ok(
            "promise.create", {"id": "job", "timeoutAt": FAR, "tags": {"resonate:target": target}}
        )
        deadline = time.monotonic() + 5
        while not hook.seen:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    headers, body = hook.seen[0]
    assert headers["idempotency-key"] == "job"
    assert headers["content-type"] == "application/json"
    assert body["kind"] == "execute"
    assert body["data"] == {"task": {"id": "job", "version": 0}}


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, Completed()),
        (204, Completed()),
        (408, Retryable("troth.http.status_408")),
        (429, Retryable("troth.http.status_429")),
        (503, Retryable("troth.http.status_503")),
        (400, Permanent("troth.http.status_400")),
        (404, Permanent("troth.http.status_404")),
    ],
)
def test_http_status_classification(status: int, expected: object) -> None:
    assert classify(status) == expected


def row_for(address: str) -> OutboxRow:
    return OutboxRow(id=1, entry=OutboxEntry(address, Execute("t", 3)), created_at=0)


def test_http_sender_against_a_real_endpoint() -> None:
    async def main() -> None:
        sender = HttpSender("http://troth")
        try:
            with hook_server() as hook:
                url = f"http://127.0.0.1:{hook.port}/x"
                assert await sender.send(row_for(url)) == Completed()
                hook.status[0] = 500
                assert await sender.send(row_for(url)) == Retryable("troth.http.status_500")
                hook.status[0] = 410
                assert await sender.send(row_for(url)) == Permanent("troth.http.status_410")
            refused = f"http://127.0.0.1:{free_port()}/x"
            assert await sender.send(row_for(refused)) == Retryable("troth.http.connect_refused")
        finally:
            await sender.close()

    asyncio.run(main())


def test_a_push_that_hangs_is_unknown_not_retried() -> None:
    from troth.outbox.dispatcher import OutboxDispatcher
    from troth.outbox.rows import Settlement
    from troth.outbox.types import DispatchConfig

    class OneRow:
        """A lifecycle holding one row; it records how the row was settled."""

        independent = True

        def __init__(self, row: OutboxRow) -> None:
            self.row: OutboxRow | None = row
            self.unknown: list[str] = []

        def claim_due(self, worker_id: str, now: int, limit: int, token: str) -> list[OutboxRow]:
            row, self.row = self.row, None
            return [row] if row else []

        def settle(self, items: list[Settlement]) -> list[bool]:
            self.unknown += [s.code or "" for s in items if s.state == "outcome_unknown"]
            return [True for _ in items]

    async def main() -> None:
        sender = HttpSender("http://troth")
        with hook_server(delay=1.0) as hook:
            rows = OneRow(row_for(f"http://127.0.0.1:{hook.port}/slow"))
            d = OutboxDispatcher(rows, sender, DispatchConfig(send_timeout=0.2))  # type: ignore[arg-type]
            report = await d.run_once(0)
            assert report.unknown == 1
            assert rows.unknown == ["troth.dispatch.send_timeout"]
            assert len(hook.seen) == 1
        await sender.close()

    asyncio.run(main())


def test_unknown_classification_is_distinct() -> None:
    assert Unknown() != Retryable("x")


def test_metrics_print_large_counters_exactly() -> None:
    from troth.server.metrics import Metrics

    m = Metrics()
    m.inc("troth_requests_total", 1_234_567, kind="promise.get", status="200")
    m.gauge("troth_sse_connections", lambda: 3.0)
    text = m.render()
    assert 'troth_requests_total{kind="promise.get",status="200"} 1234567' in text
    assert "troth_sse_connections 3\n" in text


def test_metrics_request_counts_as_inc_and_observe_do() -> None:
    """The per-request fast path renders exactly what the general calls render."""
    from troth.server.metrics import Metrics

    fast, general = Metrics(), Metrics()
    answered = [("promise.get", 200, 0.0012), ("promise.get", 404, 0.3), ("promise.get", 200, 2.5)]
    answered += [("task.acquire", 409, 0.004)]
    for kind, status, seconds in answered:
        fast.request(kind, status, seconds)
        general.inc("troth_requests_total", kind=kind, status=str(status))
        general.observe("troth_request_seconds", seconds, kind=kind)
    text = fast.render()
    assert text == general.render()
    assert 'troth_requests_total{kind="promise.get",status="200"} 2' in text
    assert fast.value("troth_requests_total", kind="task.acquire", status="409") == 1
