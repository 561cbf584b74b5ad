"""Operator limits (docs/operations.md, "Limits and slow clients"): nesting depth, id
and tag lengths, open SSE connections, slow clients.  Over a limit: the documented
status and message, nothing changed; at the limit: served."""

from __future__ import annotations

import json
import logging
import socket
import time
from typing import Any

import httpx
import pytest

from helpers.support import VERSION, RunningServer, running_server
from troth.server.config import ConfigError, Settings

FAR = 10**13


def post_raw(server: RunningServer, body: bytes) -> httpx.Response:
    return server.client.post("/", content=body, headers={"content-type": "application/json"})


def envelope(kind: str, data: str, corr: str = "lim-1", extra: str = "") -> bytes:
    head = f'{{"corrId":"{corr}","version":"{VERSION}"{extra}}}'
    return f'{{"kind":"{kind}","head":{head},"data":{data}}}'.encode()


def nested(levels: int) -> str:
    """A JSON value that is ``levels`` containers deep (objects and arrays mixed)."""
    out = "1"
    for i in range(levels):
        out = f'{{"d":{out}}}' if i % 2 else f"[{out}]"
    return out


def refused(r: httpx.Response, status: int, kind: str, corr: str, fragment: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["head"]["status"] == status
    assert body["kind"] == kind
    assert body["head"]["corrId"] == corr
    assert fragment in body["data"], body["data"]


# -- nesting depth -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        # The case: the deep value is the kind itself, which cannot be echoed.
        (
            b'{"kind": ' + b'{"d":' * 5000 + b"1" + b"}" * 5000 + b', "head": {"corrId":'
            b'"deep-1","version":"' + VERSION.encode() + b'"}, "data": {}}',
            "unknown",
        ),
        (envelope("promise.create", nested(5000), "deep-1"), "promise.create"),
        (envelope("promise.get", "{}", "deep-1", ',"x":' + nested(3000)), "promise.get"),
        (
            envelope("promise.get", '{"id":"p","extra":' + nested(100_000) + "}", "deep-1"),
            "promise.get",
        ),
        # truncated: opened and never closed
        (envelope("promise.get", "{}", "deep-1")[:-1] + b',"x":' + b"[" * 4000, "promise.get"),
    ],
    ids=["kind", "data", "head", "data-100k", "truncated"],
)
def test_deep_nesting_is_400_and_changes_nothing(
    server: RunningServer, body: bytes, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    server.ok("promise.create", {"id": "keep", "timeoutAt": FAR})
    before = server.snap()
    with caplog.at_level(logging.ERROR):
        r = post_raw(server, body)
    refused(r, 400, kind, "deep-1", "nests deeper than 64 levels")
    assert server.snap() == before
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


def test_nesting_at_the_limit_is_served(server: RunningServer) -> None:
    # envelope (1) > data (2) > "extra" (3 …): an ignored field nests to exactly 64.
    ok = envelope("promise.create", f'{{"id":"p","timeoutAt":{FAR},"x":{nested(62)}}}')
    r = post_raw(server, ok)
    assert r.status_code == 200, r.text
    deep = envelope("promise.create", f'{{"id":"q","timeoutAt":{FAR},"x":{nested(63)}}}')
    refused(post_raw(server, deep), 400, "promise.create", "lim-1", "deeper than 64")
    assert [p["id"] for p in server.snap()["promises"]] == ["p"]


def test_brackets_inside_strings_do_not_count(server: RunningServer) -> None:
    tricky = "[{" * 200 + '\\"' + "]}" * 50
    body = envelope("promise.create", f'{{"id":"{tricky}","timeoutAt":{FAR}}}')
    r = post_raw(server, body)
    assert r.status_code == 200, r.text
    assert r.json()["data"]["promise"]["id"] == tricky.replace('\\"', '"')


def test_max_depth_is_a_setting() -> None:
    settings = Settings(store="memory", debug=True, access_log=False, max_depth=8)
    with running_server(settings) as server:
        at = envelope("promise.create", f'{{"id":"a","timeoutAt":{FAR},"x":{nested(6)}}}')
        assert post_raw(server, at).status_code == 200
        over = envelope("promise.create", f'{{"id":"b","timeoutAt":{FAR},"x":{nested(7)}}}')
        refused(post_raw(server, over), 400, "promise.create", "lim-1", "deeper than 8 levels")
        assert [p["id"] for p in server.snap()["promises"]] == ["a"]
    with pytest.raises(ConfigError, match="max_depth"):
        Settings(max_depth=1000)


# -- id and tag lengths --------------------------------------------------------------

#: 1024 UTF-8 bytes in 256 characters: the limit counts bytes, as the stores index them.
AT_ID = "\U0001f600" * 256
OVER_ID = "a" + AT_ID


def test_ids_at_the_limit_are_served_on_every_backend(server: RunningServer) -> None:
    assert len(AT_ID.encode()) == 1024
    created = server.ok("promise.create", {"id": AT_ID, "timeoutAt": FAR})
    assert created["promise"]["id"] == AT_ID
    assert server.ok("promise.get", {"id": AT_ID})["promise"]["id"] == AT_ID
    tags = {"k" * 1024: "v" * 65536}
    server.ok("promise.create", {"id": "tagged", "timeoutAt": FAR, "tags": tags})
    assert server.ok("promise.get", {"id": "tagged"})["promise"]["tags"] == tags


@pytest.mark.parametrize(
    ("kind", "data", "fragment"),
    [
        ("promise.create", {"id": OVER_ID, "timeoutAt": FAR}, "id longer than 1024 bytes"),
        ("promise.get", {"id": OVER_ID}, "id longer than 1024 bytes"),
        (
            "promise.create",
            {"id": "t", "timeoutAt": FAR, "tags": {"k" * 1025: "v"}},
            "tag key longer than 1024 bytes",
        ),
        (
            "promise.create",
            {"id": "t", "timeoutAt": FAR, "tags": {"k": "v" * 65537}},
            "longer than 65536 bytes",
        ),
        (
            "promise.register_callback",
            {"awaited": "keep", "awaiter": OVER_ID},
            "awaiter longer than 1024 bytes",
        ),
        (
            "task.create",
            {
                "pid": "w",
                "ttl": 1000,
                "action": {
                    "kind": "promise.create",
                    "head": {},
                    "data": {"id": OVER_ID, "timeoutAt": FAR},
                },
            },
            "id longer than 1024 bytes (in action)",
        ),
        ("task.heartbeat", {"pid": "w", "tasks": [{"id": OVER_ID, "version": 1}]}, "tasks[].id"),
        (
            "schedule.create",
            {"id": "s", "cron": "* * * * *", "promiseId": OVER_ID, "promiseTimeout": 1},
            "promiseId longer than 1024 bytes",
        ),
    ],
    ids=["create", "get", "tag-key", "tag-value", "awaiter", "in-action", "heartbeat", "sched"],
)
def test_too_long_ids_and_tags_are_400_and_change_nothing(
    server: RunningServer, kind: str, data: dict[str, Any], fragment: str
) -> None:
    server.ok("promise.create", {"id": "keep", "timeoutAt": FAR})
    before = server.snap()
    env = server.envelope(kind, data)
    r = server.client.post("/", json=env)
    refused(r, 400, kind, env["head"]["corrId"], fragment)
    assert server.snap() == before


def test_id_limits_are_settings() -> None:
    settings = Settings(
        store="memory", debug=True, access_log=False, max_id_length=100, max_tag_length=200
    )
    with running_server(settings) as server:
        server.ok("promise.create", {"id": "i" * 100, "timeoutAt": FAR, "tags": {"t": "v" * 200}})
        status, data = server.call("promise.create", {"id": "i" * 101, "timeoutAt": FAR})
        assert (status, "longer than 100 bytes" in data) == (400, True)
        status, data = server.call(
            "promise.create", {"id": "j", "timeoutAt": FAR, "tags": {"t": "v" * 201}}
        )
        assert (status, "longer than 200 bytes" in data) == (400, True)
        assert len(server.snap()["promises"]) == 1
        # the poll path names a group and an id, which PostgreSQL nodes store
        assert server.client.get(f"/poll/{'g' * 101}/w").status_code == 414


# -- open SSE connections --------------------------------------------------------------


def open_stream(port: int, group: str, id: str) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"GET /poll/{group}/{id} HTTP/1.1\r\nhost: t\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return sock, head


def status_of(head: bytes) -> int:
    return int(head.split(b" ", 2)[1])


def test_sse_connections_are_limited_per_node_and_per_group(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(
        store="memory", debug=True, access_log=False, max_sse=3, max_sse_per_group=2
    )
    with running_server(settings) as server, caplog.at_level(logging.WARNING, "troth.server"):
        port = int(server.url.rsplit(":", 1)[1])
        a1, h = open_stream(port, "a", "1")
        assert status_of(h) == 200
        a2, h = open_stream(port, "A", "2")  # groups are case-insensitive
        assert status_of(h) == 200
        a3, h = open_stream(port, "a", "3")
        assert status_of(h) == 429
        assert b"retry-after" in h.lower()
        while not h.endswith(b"}"):  # the JSON body after the head
            h += a3.recv(4096)
        assert b"max_sse_per_group 2" in h
        b1, h = open_stream(port, "b", "1")
        assert status_of(h) == 200
        b2, h = open_stream(port, "b", "2")
        assert status_of(h) == 503
        assert any("refused SSE connection" in r.getMessage() for r in caplog.records)
        assert server.app.registry.count() == 3
        a1.close()
        deadline = time.monotonic() + 5
        while server.app.registry.count() != 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        b3, h = open_stream(port, "b", "3")
        assert status_of(h) == 200  # room again once one went away
        for s in (a2, a3, b1, b2, b3):
            s.close()


# -- slow clients ------------------------------------------------------------------------


def read_all(sock: socket.socket, limit: float) -> tuple[bytes, float]:
    """Everything until the server closes; and how long that took."""
    started = time.monotonic()
    sock.settimeout(limit)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data, time.monotonic() - started
        data += chunk


SLOW = Settings(store="memory", debug=True, access_log=False, header_timeout=0.6, body_timeout=0.6)


def test_silent_and_trickling_headers_are_cut_off_with_408() -> None:
    with running_server(SLOW) as server:
        port = int(server.url.rsplit(":", 1)[1])
        silent = socket.create_connection(("127.0.0.1", port))
        data, took = read_all(silent, 10)
        assert data.startswith(b"HTTP/1.1 408 "), data
        assert json.loads(data.split(b"\r\n\r\n", 1)[1])["head"]["status"] == 408
        assert 0.5 < took < 5

        trickle = socket.create_connection(("127.0.0.1", port))
        started = time.monotonic()
        request = b"POST / HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        try:
            for byte in request:
                trickle.sendall(bytes([byte]))
                time.sleep(0.05)
        except OSError:
            pass  # cut off mid-way: what the test wants
        data, _ = read_all(trickle, 10)
        assert b"408" in data.split(b"\r\n", 1)[0]
        assert time.monotonic() - started < 6


def test_trickling_body_is_cut_off_and_changes_nothing() -> None:
    with running_server(SLOW) as server:
        port = int(server.url.rsplit(":", 1)[1])
        before = server.snap()
        body = envelope("promise.create", f'{{"id":"slow","timeoutAt":{FAR}}}')
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(
            b"POST / HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body) + body[:20]
        )
        data, took = read_all(sock, 10)
        status_line, rest = data.split(b"\r\n", 1)
        assert b" 408 " in status_line
        payload = json.loads(rest.split(b"\r\n\r\n", 1)[1])
        assert payload["head"]["status"] == 408
        assert "body not received within 0.6 s" in payload["data"]
        assert took < 5
        assert server.snap() == before


def test_a_request_within_the_deadlines_is_served() -> None:
    with running_server(SLOW) as server:
        port = int(server.url.rsplit(":", 1)[1])
        body = envelope("promise.create", f'{{"id":"fine","timeoutAt":{FAR}}}')
        sock = socket.create_connection(("127.0.0.1", port))
        for _ in range(3):  # several requests on one connection, each a little slow
            sock.sendall(b"POST / HTTP/1.1\r\nhost: t\r\n")
            time.sleep(0.3)
            sock.sendall(b"content-length: %d\r\n\r\n" % len(body) + body[:10])
            time.sleep(0.3)
            sock.sendall(body[10:])
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(65536)
            assert head.startswith(b"HTTP/1.1 200 "), head
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            rest = head.split(b"\r\n\r\n", 1)[1]
            while len(rest) < length:
                rest += sock.recv(65536)
            time.sleep(0.8)  # idle between requests is idle_timeout's business, not these
        sock.close()


def test_idle_keep_alive_connection_is_closed_after_idle_timeout() -> None:
    settings = Settings(store="memory", debug=True, access_log=False, idle_timeout=1)
    with running_server(settings) as server:
        port = int(server.url.rsplit(":", 1)[1])
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n")
        data, took = read_all(sock, 10)
        assert data.startswith(b"HTTP/1.1 200 ")
        assert 0.5 < took < 5


def simple_post(corr: str) -> bytes:
    """A ``POST /`` the protocol answers itself (server/http/direct.py's simple path)."""
    body = envelope("promise.get", '{"id": "nope"}', corr)
    return b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n" % len(body) + body


def read_answer(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, rest = data.split(b"\r\n\r\n", 1)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(rest) < length:
        rest += sock.recv(65536)
    return head


def test_idle_simple_connection_is_closed_after_idle_timeout_and_kept_while_used() -> None:
    """A simple request's connection has no keep-alive timer of its own: the sweeper
    closes it once idle past idle_timeout, and not while requests keep coming."""
    settings = Settings(store="memory", debug=True, access_log=False, idle_timeout=1)
    with running_server(settings) as server:
        port = int(server.url.rsplit(":", 1)[1])
        sock = socket.create_connection(("127.0.0.1", port))
        for i in range(4):  # 2.4 s in all, never 1 s idle: the same connection serves
            sock.sendall(simple_post(f"kept-{i}"))
            assert read_answer(sock).startswith(b"HTTP/1.1 404 ")  # no such promise
            time.sleep(0.6)
        data, took = read_all(sock, 10)
        assert data == b""  # closed, nothing more written
        assert 0.2 < took < 2.5  # 1 s after the last answer (0.6 s of it slept above)
        sock.close()


def test_sse_streams_are_not_cut_off_by_the_read_deadlines() -> None:
    with running_server(SLOW) as server:
        port = int(server.url.rsplit(":", 1)[1])
        sock, head = open_stream(port, "g", "w")
        assert status_of(head) == 200
        time.sleep(1.5)  # well past header_timeout and body_timeout
        assert server.app.registry.count() == 1
        sock.close()
