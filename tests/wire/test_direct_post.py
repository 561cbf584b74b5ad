"""``POST /`` answered by the protocol itself (server/http/direct.py), over real sockets.

The direct path must be taken (a uvicorn upgrade that removed its hook would make it
silently slower), and what it writes must be what the ASGI path writes: the same
status line, headers and body, keep-alive, pipelining, ``Connection: close``,
HTTP/1.0, ``Expect: 100-continue`` and an oversized body handled alike.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers.support import RunningServer, running_server
from troth.server.config import Settings
from troth.server.http.asgi import json_headers
from troth.server.http.direct import DirectHttpToolsProtocol, JsonHeads, response, simple_request

SETTINGS = Settings(store="memory", access_log=False, max_body=4096)


@contextmanager
def server(direct: bool) -> Iterator[RunningServer]:
    with running_server(SETTINGS) as rs:
        assert rs.server is not None
        protocol = rs.server.config.http
        assert isinstance(protocol, type) and issubclass(protocol, DirectHttpToolsProtocol)
        if not direct:
            protocol.troth = None  # every request through ASGI, as before
        yield rs


def port_of(rs: RunningServer) -> int:
    return int(rs.url.rsplit(":", 1)[1])


def envelope(corr: str, id: str = "p1") -> bytes:
    data = {"id": id, "timeoutAt": 2**40, "param": {}, "tags": {}}
    head = {"corrId": corr, "version": "2026-04-01"}
    return json.dumps({"kind": "promise.create", "head": head, "data": data}).encode()


def post(body: bytes, *, version: str = "1.1", extra: str = "") -> bytes:
    return (
        f"POST / HTTP/{version}\r\nhost: t\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def chunked(body: bytes) -> bytes:
    """A ``POST /`` with a chunked body (not simple: httptools reads it)."""
    head = b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
    half = len(body) // 2
    parts = (body[:half], body[half:])
    return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def read_responses(sock: socket.socket, count: int) -> list[tuple[str, dict[str, str], bytes]]:
    """``count`` responses: status line, headers (lower-case names), body."""
    buf = b""
    out: list[tuple[str, dict[str, str], bytes]] = []
    while len(out) < count:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise AssertionError(f"connection closed after {len(out)} responses: {buf!r}")
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        if lines[0].startswith("HTTP/1.1 100"):
            out.append((lines[0], headers, b""))
            continue
        length = int(headers["content-length"])
        while len(buf) < length:
            buf += sock.recv(65536)
        out.append((lines[0], headers, buf[:length]))
        buf = buf[length:]
    return out


def exchange(rs: RunningServer, payload: bytes, count: int = 1) -> list[Any]:
    with socket.create_connection(("127.0.0.1", port_of(rs)), timeout=10) as sock:
        sock.sendall(payload)
        return read_responses(sock, count)


def closed_after(rs: RunningServer, payload: bytes) -> bool:
    """Whether the server closes the connection after answering ``payload``.

    A server that closes does so right after the answer; one that keeps the
    connection says nothing more, so that side waits out the short timeout (not the
    10 s of the exchange: three such cases on two servers cost a minute of CI)."""
    with socket.create_connection(("127.0.0.1", port_of(rs)), timeout=10) as sock:
        sock.sendall(payload)
        read_responses(sock, 1)
        sock.settimeout(2.0)
        try:
            return sock.recv(1) == b""
        except TimeoutError:
            return False


def comparable(response: tuple[str, dict[str, str], bytes]) -> Any:
    status, headers, body = response
    return status, {k: v for k, v in headers.items() if k != "date"}, body


@pytest.mark.parametrize(
    "payload,count",
    [
        (post(envelope("a")), 1),
        (post(envelope("a")) + post(envelope("b")) + post(b"{not json"), 3),  # pipelined
        (post(envelope("a"), extra="connection: close\r\n"), 1),
        (post(envelope("a"), version="1.0"), 1),
        (post(envelope("a"), extra="expect: 100-continue\r\n"), 2),
        (post(b"x" * 5000), 1),  # over max_body: 413
        (post(envelope("a")) + chunked(envelope("b", id="p2")) + post(envelope("c")), 3),
        (post(envelope("a"), extra="Content-Length: 7\r\n"), 1),  # two lengths: 400
        (post(envelope("a"), extra="X-Tab:\tv\t\r\nAuthorization:  Bearer  \r\n"), 1),
    ],
    ids=[
        "one",
        "pipelined",
        "connection-close",
        "http-1.0",
        "expect-100",
        "too-large",
        "simple-then-chunked",
        "two-lengths",
        "odd-whitespace",
    ],
)
def test_direct_answers_as_asgi_does(payload: bytes, count: int) -> None:
    answers = {}
    for direct in (True, False):
        with server(direct) as rs:
            answers[direct] = [comparable(r) for r in exchange(rs, payload, count)]
            closes = closed_after(rs, payload) if count == 1 else None
            assert rs.server is not None
            taken = rs.server.config.http.counts["direct"]
            # Two Content-Lengths: httptools refuses the request (400) on both paths.
            by_troth = direct and b"Content-Length: 7" not in payload
            assert (taken > 0) is by_troth, (direct, taken)
            simple = rs.server.config.http.counts["simple"]
            # A simple request at the start is read without httptools (then the
            # connection falls back at the first that is not); the others never are.
            starts_simple = payload.startswith(b"POST / HTTP/1.1") and b"expect" not in payload
            if not direct or b"x" * 5000 in payload or b"Content-Length: 7" in payload:
                starts_simple = False
            assert (simple > 0) is starts_simple, (direct, simple)
            answers[direct].append(closes)
    assert answers[True] == answers[False]
    first = answers[True][0]
    assert first[0].startswith("HTTP/1.1 ")
    if b"{not json" in payload:
        assert json.loads(answers[True][2][2])["head"]["status"] == 400


def test_keep_alive_serves_many_requests_on_one_connection() -> None:
    with server(True) as rs, socket.create_connection(("127.0.0.1", port_of(rs))) as sock:
        for i in range(20):
            sock.sendall(post(envelope(f"k{i}", id=f"p{i}")))
            [(status, headers, body)] = read_responses(sock, 1)
            assert status == "HTTP/1.1 200 OK"
            assert headers["content-type"] == "application/json"
            reply = json.loads(body)
            assert reply["head"]["corrId"] == f"k{i}"
            assert reply["data"]["promise"]["id"] == f"p{i}"
        assert rs.server is not None and rs.server.config.http.counts["direct"] == 20


def test_a_client_gone_mid_body_leaves_the_server_serving() -> None:
    with server(True) as rs:
        with socket.create_connection(("127.0.0.1", port_of(rs))) as sock:
            body = envelope("gone")
            sock.sendall(post(body)[: -len(body) // 2])  # half the body, then hang up
        [(status, _, reply)] = exchange(rs, post(envelope("after", id="p2")))
        assert status == "HTTP/1.1 200 OK"
        assert json.loads(reply)["data"]["promise"]["id"] == "p2"


def test_cors_servers_answer_through_asgi() -> None:
    settings = replace(SETTINGS, cors_allow_origins="https://ui.example")
    with running_server(settings) as rs:
        origin = "origin: https://ui.example\r\n"
        [(status, headers, _)] = exchange(rs, post(envelope("c"), extra=origin))
        assert status == "HTTP/1.1 200 OK"
        assert headers["access-control-allow-origin"] == "https://ui.example"
        assert rs.server is not None and rs.server.config.http.counts["direct"] == 0


@pytest.mark.parametrize(
    "payload",
    [
        post(envelope("a"), extra="connection: keep-alive, close\r\n"),
        post(envelope("a"), extra="x-colon: a:b:c\r\n"),
        post(envelope("a")).replace(b"content-length: ", b"content-length: 000"),
        post(envelope("a")).replace(b"content-length: ", b"Content-Length:   "),
        post(envelope("a"), extra="content-length: -1\r\n"),
        post(envelope("a"), extra="x-ctl: a\x01b\r\n"),
        post(b"{}"),
        b"POST / HTTP/1.1\r\nhost: t\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost t\r\ncontent-length: 2\r\n\r\n{}",
        b"post / HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}",
    ],
    ids=[
        "keep-alive-close",
        "colons-in-value",
        "length-leading-zeros",
        "length-spaces",
        "negative-length",
        "control-in-value",
        "empty-envelope",
        "no-body",
        "header-without-colon",
        "lower-case-method",
    ],
)
def test_odd_requests_are_answered_as_asgi_answers_them(payload: bytes) -> None:
    """Whatever the simple reader takes or leaves to httptools, the answer (or the
    refusal, or the closed connection) is the one the ASGI path gives."""
    answers: dict[bool, Any] = {}
    for direct in (True, False):
        with server(direct) as rs:
            try:
                answers[direct] = [comparable(r) for r in exchange(rs, payload)]
            except AssertionError as exc:  # closed without an answer
                answers[direct] = str(exc)[:40]
    assert answers[True] == answers[False]


def test_a_request_split_across_reads_is_read_by_httptools_and_served() -> None:
    """A head that arrives in pieces is not simple: httptools reads it (with its
    deadlines), the answer is the same, and the connection goes on serving."""
    with server(True) as rs, socket.create_connection(("127.0.0.1", port_of(rs))) as sock:
        sock.sendall(post(envelope("s0", id="p0")))
        assert read_responses(sock, 1)[0][0] == "HTTP/1.1 200 OK"
        payload = post(envelope("s1", id="p1"))
        sock.sendall(payload[:10])
        time.sleep(0.2)
        sock.sendall(payload[10:])
        [(status, _, body)] = read_responses(sock, 1)
        assert status == "HTTP/1.1 200 OK"
        assert json.loads(body)["data"]["promise"]["id"] == "p1"
        sock.sendall(post(envelope("s2", id="p2")))
        [(status, _, body)] = read_responses(sock, 1)
        assert json.loads(body)["data"]["promise"]["id"] == "p2"
        assert rs.server is not None
        assert rs.server.config.http.counts["simple"] == 1
        assert rs.server.config.http.counts["direct"] == 3


def test_a_graceful_stop_answers_the_simple_request_in_flight() -> None:
    """A stop while a simple request is being answered closes its connection only
    after the answer is written (not at once, as an idle connection is)."""
    with server(True) as rs:
        assert rs.server is not None
        engine = rs.app.engine
        loop = engine._loop
        assert loop is not None
        gate = threading.Event()
        # The writer thread holds the store: the request below waits, in flight.
        held = asyncio.run_coroutine_threadsafe(engine.exclusive(lambda: gate.wait(10)), loop)
        with socket.create_connection(("127.0.0.1", port_of(rs)), timeout=10) as sock:
            sock.sendall(post(envelope("g", id="pg")))
            time.sleep(0.2)
            rs.server.should_exit = True  # what SIGTERM does
            time.sleep(0.3)
            gate.set()
            [(status, headers, body)] = read_responses(sock, 1)
            assert status == "HTTP/1.1 200 OK"
            assert headers.get("connection") == "close"
            assert json.loads(body)["data"]["promise"]["id"] == "pg"
            assert sock.recv(1) == b""
        held.result(10)
        assert rs.server.config.http.counts["simple"] == 1


def get(corr: str, id: str) -> bytes:
    head = {"corrId": corr, "version": "2026-04-01"}
    return json.dumps({"kind": "promise.get", "head": head, "data": {"id": id}}).encode()


def test_answers_written_at_once_keep_their_order(tmp_path: Path) -> None:
    """A point read (SQLite) and a refusal are answered while their bytes are being
    read, with no task; hundreds of them pipelined in one write after a request that
    waits for its commit are answered in order and as the ASGI path answers them (and
    the reader does not recurse once per request: that would overflow the stack)."""
    requests = [post(envelope("c0", id="p0"))]
    for i in range(1, 300):
        requests.append(post(b"{not json" if i % 7 == 0 else get(f"g{i}", "p0")))
    payload = b"".join(requests)
    answers: dict[bool, Any] = {}
    for direct in (True, False):
        settings = replace(SETTINGS, store="sqlite", db=str(tmp_path / f"{direct}.db"))
        with running_server(settings) as rs:
            assert rs.server is not None
            if not direct:
                rs.server.config.http.troth = None
            answers[direct] = [comparable(r) for r in exchange(rs, payload, len(requests))]
            if direct:
                assert rs.server.config.http.counts["simple"] >= 200
    assert answers[True] == answers[False]
    corrs = [json.loads(body)["head"]["corrId"] for _, _, body in answers[True]]
    assert corrs[:3] == ["c0", "g1", "g2"] and corrs[-1] == "g299"


def test_answers_written_at_once_wait_for_a_peer_that_does_not_read(tmp_path: Path) -> None:
    """Point reads pipelined by a peer that does not read its answers: once the
    server's write buffer is full, an answer ready at once waits for it to drain
    (answer_simple), and what is held waits behind it; when the peer reads, every
    answer arrives, in order."""
    data = {"id": "big", "timeoutAt": 2**40, "param": {"data": "x" * 40_000}, "tags": {}}
    head = {"corrId": "c0", "version": "2026-04-01"}
    create = json.dumps({"kind": "promise.create", "head": head, "data": data}).encode()
    count = 300
    reads = b"".join(post(get(f"g{i}", "big")) for i in range(1, count))
    settings = replace(SETTINGS, store="sqlite", db=str(tmp_path / "t.db"), max_body=100_000)
    with running_server(settings) as rs:
        with socket.create_connection(("127.0.0.1", port_of(rs)), timeout=30) as sock:
            sock.sendall(post(create))
            [created] = read_responses(sock, 1)
            assert created[0] == "HTTP/1.1 200 OK"
            sock.sendall(reads)  # one write: read whole, answered while read
            time.sleep(1.0)  # the server answers until its buffer is full, then waits
            answers = read_responses(sock, count - 1)
        assert rs.server is not None
        assert rs.server.config.http.counts["simple"] == count
    corrs = [json.loads(body)["head"]["corrId"] for _, _, body in answers]
    assert corrs == [f"g{i}" for i in range(1, count)]
    assert {status for status, _, _ in answers} == {"HTTP/1.1 200 OK"}
    assert all(len(body) > 40_000 for _, _, body in answers)


def test_a_bug_before_the_engine_is_a_500_not_a_dropped_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An exception where none is expected (here: admitting the envelope) is answered
    500 and the connection closed, as uvicorn answers a failing app — not left to the
    event loop, which would drop the connection without an answer."""
    with server(True) as rs:

        def broken(*_: Any) -> Any:
            raise RuntimeError("bug (test)")

        monkeypatch.setattr(rs.app.envelopes, "admit", broken)
        with socket.create_connection(("127.0.0.1", port_of(rs)), timeout=10) as sock:
            sock.sendall(post(envelope("b")))
            [(status, headers, body)] = read_responses(sock, 1)
            assert status == "HTTP/1.1 500 Internal Server Error"
            assert headers.get("connection") == "close" and body == b"Internal Server Error"
            assert sock.recv(1) == b""


def test_a_simple_requests_headers_are_its_lines_split_and_stripped() -> None:
    """Names lower-cased, values without the spaces and tabs around them, whatever
    the whitespace inside (the parser's expression against a plain split)."""
    rng = random.Random(16)
    pieces = [b"a", b"b c", b"x\ty", b"q=1;  r", b":", b"", b"z "]
    for _ in range(500):
        lines = []
        for n in range(rng.randint(0, 5)):
            value = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 3)))
            left = b"".join(rng.choice([b" ", b"\t"]) for _ in range(rng.randint(0, 2)))
            right = b"".join(rng.choice([b" ", b"\t"]) for _ in range(rng.randint(0, 2)))
            lines.append(b"X-H%d:" % n + left + value + right + b"\r\n")
        body = b"{}"
        data = (
            b"POST / HTTP/1.1\r\n"
            + b"".join(lines)
            + b"Content-Length: %d\r\n\r\n" % len(body)
            + body
        )
        parsed = simple_request(data, 4096)
        assert parsed is not None
        headers, got_body, keep_alive, end = parsed
        expected = [
            (line.split(b":", 1)[0].lower(), line[:-2].split(b":", 1)[1].strip(b" \t"))
            for line in lines
        ] + [(b"content-length", b"2")]
        assert headers == expected
        assert (got_body, keep_alive, end) == (body, True, len(data))


def test_a_json_head_made_once_is_the_head_made_per_answer() -> None:
    """An answer written at once (JsonHeads: the head up to Content-Length made once
    per status and per list of default headers) is byte for byte what the head built
    from its header lines is, and a new list of defaults (uvicorn's Date, once a
    second) makes a new head."""
    heads = JsonHeads()
    for defaults in ([], [(b"date", b"Thu, 03 Dec 2026 20:00:00 GMT")], [(b"date", b"later")]):
        for status in (200, 201, 400, 404, 409, 500, 503):
            for body in (b"", b"{}", json.dumps({"x": "y" * 1000}).encode()):
                made = heads.answer(status, defaults, body)
                assert made == response(status, defaults, json_headers(body, status), True, body)


def test_an_answer_that_does_not_encode_is_a_500(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An answer ready at once (a point read) whose encoding raises (a bug) is
    answered 500 with ``connection: close``, as any failure outside the envelope."""
    import troth.server.http.direct as direct

    settings = replace(SETTINGS, store="sqlite", db=str(tmp_path / "t.db"))
    with running_server(settings) as rs:

        def broken(*_: Any) -> bytes:
            raise RuntimeError("bug (test)")

        monkeypatch.setattr(direct, "encode_response", broken)
        with socket.create_connection(("127.0.0.1", port_of(rs)), timeout=10) as sock:
            sock.sendall(post(get("g", "missing")))
            [(status, headers, body)] = read_responses(sock, 1)
            assert status == "HTTP/1.1 500 Internal Server Error"
            assert headers.get("connection") == "close" and body == b"Internal Server Error"
            assert sock.recv(1) == b""
