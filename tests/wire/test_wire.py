"""The wire: envelope, routes, bad input, internal errors.

Every refusal must leave the store exactly as it was, so most tests compare
``debug.snap`` before and after.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import httpx
import pytest

from helpers.support import VERSION, RunningServer, running_server
from troth.machine import core
from troth.server.config import Settings


def post_raw(server: RunningServer, body: bytes) -> httpx.Response:
    return server.client.post("/", content=body, headers={"content-type": "application/json"})


def test_response_echoes_kind_corr_and_status(server: RunningServer) -> None:
    r = server.client.post(
        "/",
        json={
            "kind": "promise.get",
            "head": {"corrId": "abc-1", "version": VERSION},
            "data": {"id": "nope"},
        },
    )
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body == {
        "kind": "promise.get",
        "head": {"corrId": "abc-1", "status": 404, "version": VERSION},
        "data": "Promise not found",
    }


def test_records_are_camel_case_and_omit_absent_fields(server: RunningServer) -> None:
    body = server.ok(
        "task.create",
        {
            "pid": "w1",
            "ttl": 1000,
            "action": {
                "kind": "promise.create",
                "head": {},
                "data": {
                    "id": "wf",
                    "timeoutAt": 9000,
                    "param": {"headers": {"a": "b"}, "data": "eA=="},
                    "tags": {"resonate:target": "poll://any@g"},
                },
            },
        },
        now=1000,
    )
    assert body["promise"] == {
        "id": "wf",
        "state": "pending",
        "param": {"headers": {"a": "b"}, "data": "eA=="},
        "value": {},
        "tags": {"resonate:target": "poll://any@g"},
        "timeoutAt": 9000,
        "createdAt": 1000,
    }
    assert "settledAt" not in body["promise"]
    assert body["task"] == {
        "id": "wf",
        "state": "acquired",
        "version": 1,
        "resumes": 0,
        "ttl": 1000,
        "pid": "w1",
    }
    assert body["preload"] == []
    status, _ = server.call("task.release", {"id": "wf", "version": 1}, now=1001)
    assert status == 200
    task = server.ok("task.get", {"id": "wf"}, now=1002)["task"]
    assert task == {"id": "wf", "state": "pending", "version": 1, "resumes": 0}


def test_no_null_anywhere(server: RunningServer) -> None:
    server.ok("promise.create", {"id": "a", "timeoutAt": 9000}, now=1000)
    r = server.raw("promise.get", {"id": "a"}, now=1000)
    assert b"null" not in r.content


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "Invalid request envelope"),
        (b"[]", "Invalid request envelope"),
        (b'{"kind":"promise.get","data":{"id":"x"}}', "Invalid request envelope"),
        (
            b'{"kind":"promise.get","head":{"corrId":"c","version":"2025-01-01"},"data":{"id":"x"}}',
            "Unsupported protocol version",
        ),
        (
            b'{"kind":"promise.get","head":{"corrId":"c"},"data":{"id":"x"}}',
            "Invalid request envelope",
        ),
        (
            b'{"kind":"promise.get","head":{"corrId":"c","version":"2026-04-01"},"data":[1]}',
            "data must be an object",
        ),
        (
            b'{"kind":"promise.nope","head":{"corrId":"c","version":"2026-04-01"},"data":{}}',
            "Unknown operation: promise.nope",
        ),
        (
            b'{"kind":"promise.create","head":{"corrId":"c","version":"2026-04-01"},'
            b'"data":{"id":"x","timeoutAt":"soon"}}',
            "timeoutAt",
        ),
        (
            b'{"kind":"promise.create","head":{"corrId":"c","version":"2026-04-01"},'
            b'"data":{"id":"x","timeoutAt":-1}}',
            "timeoutAt",
        ),
        (
            b'{"kind":"promise.create","head":{"corrId":"c","version":"2026-04-01"},'
            b'"data":{"timeoutAt":5}}',
            "id",
        ),
        (
            b'{"kind":"task.acquire","head":{"corrId":"c","version":"2026-04-01"},'
            b'"data":{"id":"x","version":0,"pid":"p"}}',
            "ttl",
        ),
        (
            b'{"kind":"task.create","head":{"corrId":"c","version":"2026-04-01"},'
            b'"data":{"pid":"p","ttl":5,"action":{"kind":"promise.settle","head":{},"data":{}}}}',
            "Invalid action kind",
        ),
        (
            b'{"kind":"promise.settle","head":{"corrId":"c","version":"2026-04-01"},'
            b'"data":{"id":"x","state":"done"}}',
            "cannot be set by a client",
        ),
    ],
)
def test_bad_input_is_400_with_a_message_and_changes_nothing(
    server: RunningServer, body: bytes, fragment: str
) -> None:
    server.ok("promise.create", {"id": "x", "timeoutAt": 9_999_999_999_999})
    before = server.snap()
    r = post_raw(server, body)
    assert r.status_code == 400
    payload = r.json()
    assert payload["head"]["status"] == 400
    assert isinstance(payload["data"], str)
    assert fragment in payload["data"]
    assert server.snap() == before


def test_refused_envelope_still_echoes_what_it_can(server: RunningServer) -> None:
    r = post_raw(
        server, b'{"kind":"promise.get","head":{"corrId":"k9","version":"1999"},"data":{}}'
    )
    assert r.json()["kind"] == "promise.get"
    assert r.json()["head"]["corrId"] == "k9"
    r = post_raw(server, b"garbage")
    assert r.json()["kind"] == "unknown"
    assert r.json()["head"]["corrId"] == "0"


def test_oversized_body_is_413_and_changes_nothing(tmp_path: Any) -> None:
    settings = Settings(store="memory", debug=True, max_body=1024, access_log=False)
    with running_server(settings) as server:
        before = server.snap()
        big = {"id": "big", "timeoutAt": 10**13, "param": {"data": "x" * 5000}}
        r = server.raw("promise.create", big)
        assert r.status_code == 413
        assert r.json()["head"]["status"] == 413
        assert server.snap() == before
        # Just under the limit is served.
        small = {"id": "small", "timeoutAt": 10**13, "param": {"data": "x" * 100}}
        assert server.raw("promise.create", small).status_code == 200


def test_default_body_limit_is_ten_mebibytes() -> None:
    assert Settings().max_body == 10 * 1024 * 1024


def test_debug_operations_are_forbidden_without_debug() -> None:
    with running_server(Settings(store="memory", access_log=False)) as server:
        for kind in ("debug.snap", "debug.reset", "debug.start", "debug.stop"):
            status, data = server.call(kind, {})
            assert status == 403, kind
            assert "disabled" in data
        status, _ = server.call("debug.tick", {"time": 5})
        assert status == 403


def test_debug_time_is_ignored_without_debug() -> None:
    with running_server(Settings(store="memory", access_log=False)) as server:
        body = server.ok("promise.create", {"id": "p", "timeoutAt": 10**13}, now=5)
        assert body["promise"]["createdAt"] > 1_700_000_000_000


def test_health_ready_and_legacy_paths(server: RunningServer) -> None:
    assert server.client.get("/health").status_code == 200
    ready = server.client.get("/ready")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"
    for path in ("/promises", "/promises/abc", "/tasks/claim", "/schedules/x"):
        for method in ("GET", "POST"):
            r = server.client.request(method, path)
            assert r.status_code == 410, (method, path)
            assert "no longer supported" in r.json()["error"]
    assert server.client.get("/").status_code == 405
    assert server.client.get("/nowhere").status_code == 404


def test_ready_is_503_when_the_store_cannot_answer(server: RunningServer) -> None:
    store = server.app.engine.store
    original = store.ping

    def broken() -> None:
        raise RuntimeError("disk on fire")

    store.ping = broken  # type: ignore[method-assign]
    try:
        r = server.client.get("/ready")
        assert r.status_code == 503
        assert "disk on fire" in r.json()["error"]
    finally:
        store.ping = original  # type: ignore[method-assign]
    # The node probes the store once a second while it is not ready: 200 again soon.
    deadline = time.monotonic() + 5
    while server.client.get("/ready").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_python_sdk_origin_header_line_is_served(server: RunningServer) -> None:
    """resonate-sdk 0.8.1 sends a header line literally named ``resonate:origin``."""
    server.ok("promise.create", {"id": "wf", "timeoutAt": 10**13})
    body = (
        b'{"kind":"promise.get","head":{"corrId":"o1","version":"2026-04-01"},"data":{"id":"wf"}}'
    )
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"resonate:origin: wf\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        reply = b""
        while b'"corrId":"o1"' not in reply:
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200")
    assert b'"corrId":"o1"' in reply


@pytest.mark.parametrize("root", ["wf:1.2", "wf.1.2"])
def test_both_lineage_id_forms_are_accepted(server: RunningServer, root: str) -> None:
    tags = {"resonate:origin": "wf", "resonate:target": "poll://any@g"}
    body = server.ok("promise.create", {"id": root, "timeoutAt": 10**13, "tags": tags})
    assert body["promise"]["id"] == root
    assert server.ok("task.acquire", {"id": root, "version": 0, "pid": "p", "ttl": 5000})


def test_preload_carries_the_branch(server: RunningServer) -> None:
    branch = {"resonate:branch": "wf", "resonate:origin": "wf"}
    server.ok("promise.create", {"id": "wf:1", "timeoutAt": 10**13, "tags": branch}, now=1)
    server.ok("promise.create", {"id": "other", "timeoutAt": 10**13, "tags": {}}, now=1)
    body = server.ok(
        "task.create",
        {
            "pid": "p",
            "ttl": 1000,
            "action": {
                "kind": "promise.create",
                "head": {},
                "data": {
                    "id": "wf",
                    "timeoutAt": 10**13,
                    "tags": {**branch, "resonate:target": "poll://any@g"},
                },
            },
        },
        now=2,
    )
    assert [p["id"] for p in body["preload"]] == ["wf:1"]


def test_a_fence_answers_an_empty_preload_while_acquire_lists_the_branch(
    server: RunningServer,
) -> None:
    """docs/protocol.md "preload": a ``task.fence`` answers ``preload: []`` however many
    siblings its branch has (as the SDKs' own servers do; listing them made N
    sequential steps cost O(N²)), while ``task.acquire`` still lists them for the
    replay."""
    branch = {"resonate:branch": "wf", "resonate:origin": "wf"}
    task = {"resonate:target": "poll://any@g", **branch}
    server.ok("promise.create", {"id": "wf", "timeoutAt": 10**13, "tags": task}, now=1)
    granted = server.ok("task.acquire", {"id": "wf", "version": 0, "pid": "p", "ttl": 60_000})
    assert granted["preload"] == []
    for i in range(3):
        answer = server.ok(
            "task.fence",
            {
                "id": "wf",
                "version": 1,
                "action": {
                    "kind": "promise.create",
                    "head": {},
                    "data": {"id": f"wf:{i}", "timeoutAt": 10**13, "tags": branch},
                },
            },
            now=2,
        )
        assert answer["action"]["data"]["promise"]["id"] == f"wf:{i}"
        assert answer["preload"] == []
    server.ok("task.release", {"id": "wf", "version": 1})
    again = server.ok("task.acquire", {"id": "wf", "version": 1, "pid": "p", "ttl": 60_000})
    assert [p["id"] for p in again["preload"]] == ["wf:0", "wf:1", "wf:2"]


def test_internal_error_is_500_rolled_back_and_logged(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from troth.protocol import requests as rq

    server.ok("promise.create", {"id": "keep", "timeoutAt": 10**13}, now=1)
    before = server.snap()

    def explode(tx: Any, req: Any, now: int) -> Any:
        core.HANDLERS[rq.PromiseCreate](tx, rq.PromiseCreate(id="half", timeout_at=10**13), now)
        raise RuntimeError("boom")

    monkeypatch.setitem(core.HANDLERS, rq.PromiseSettle, explode)
    env = server.envelope("promise.settle", {"id": "keep", "state": "resolved"}, now=2)
    with caplog.at_level(logging.ERROR, logger="troth.server"):
        r = server.client.post("/", json=env)
    assert r.status_code == 500
    corr = env["head"]["corrId"]
    assert r.json()["head"] == {"corrId": corr, "status": 500, "version": VERSION}
    assert corr in r.json()["data"]
    assert server.snap() == before
    assert any(corr in rec.getMessage() for rec in caplog.records)


def test_one_failing_request_does_not_touch_its_neighbours(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrent requests may share a transaction; a failure is rolled back alone."""
    from troth.protocol import requests as rq

    real = core.HANDLERS[rq.PromiseCreate]

    def sometimes(tx: Any, req: Any, now: int) -> Any:
        result = real(tx, req, now)
        if req.id.startswith("bad"):
            raise RuntimeError("injected")
        return result

    monkeypatch.setitem(core.HANDLERS, rq.PromiseCreate, sometimes)
    statuses: dict[str, int] = {}

    def send(id: str) -> None:
        with httpx.Client(base_url=server.url) as c:
            env = server.envelope("promise.create", {"id": id, "timeoutAt": 10**13}, now=5)
            statuses[id] = c.post("/", json=env).status_code

    ids = [f"{'bad' if i % 4 == 0 else 'good'}-{i}" for i in range(40)]
    threads = [threading.Thread(target=send, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stored = {p["id"] for p in server.snap()["promises"]}
    for id in ids:
        if id.startswith("bad"):
            assert statuses[id] == 500
            assert id not in stored
        else:
            assert statuses[id] == 200
            assert id in stored
