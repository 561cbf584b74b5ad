"""Protocol calls over the bench's HTTP connections, and the checks every reply passes.

Every reply is checked as an SDK would check it (same ``kind``, same ``corrId``,
HTTP status = ``head.status``) before a workload looks at it: a server that answered
fast but wrongly must fail the bench, not win it.
"""

from __future__ import annotations

import itertools
from typing import Any

import msgspec

from troth_bench.http import HttpConnection

VERSION = "2026-04-01"
FAR = 2**53  # a timeoutAt no run reaches: these promises never time out


class BenchFailure(AssertionError):
    """A workload's verification failed: the figures of that run are not a result."""


class _Head(msgspec.Struct):
    corrId: str
    status: int


class _Reply(msgspec.Struct):
    kind: str
    head: _Head
    data: msgspec.Raw


_decode_reply = msgspec.json.Decoder(_Reply).decode
_encode = msgspec.json.Encoder().encode
_corr = itertools.count(1)


def request_body(kind: str, corr: str, data: Any) -> bytes:
    """A request envelope as the SDKs send it (over HTTP or NATS alike)."""
    return _encode({"kind": kind, "head": {"corrId": corr, "version": VERSION}, "data": data})


def checked_reply(kind: str, corr: str, raw: bytes) -> _Reply:
    """The reply to request ``kind``/``corr``; a reply that does not decode, or that
    answers another request, fails the workload."""
    try:
        reply = _decode_reply(raw)
    except msgspec.DecodeError as exc:
        raise BenchFailure(f"{kind}: undecodable reply {raw[:200]!r}: {exc}") from None
    if reply.kind != kind or reply.head.corrId != corr:
        raise BenchFailure(f"{kind} {corr}: reply is for {reply.kind} {reply.head.corrId}")
    return reply


class Client:
    """One keep-alive connection that speaks the protocol envelope."""

    def __init__(self, conn: HttpConnection, name: str) -> None:
        self.conn = conn
        self.name = name
        self.reconnects = 0

    @property
    def read_at(self) -> float:
        """When the latest reply's bytes reached this process (``perf_counter``)."""
        return self.conn.read_at

    @classmethod
    async def open(cls, host: str, port: int, name: str) -> Client:
        return cls(await HttpConnection.open(host, port), name)

    async def call(self, kind: str, data: Any) -> tuple[int, Any, float]:
        """Send one request; returns ``(status, data, seconds)`` once the reply passed
        the envelope checks.  The seconds run from the write to the moment the reply's
        bytes reached this process, so time the generator spends before it gets round
        to the reply (parsing, other clients) is not charged to the server."""
        corr = f"{self.name}-{next(_corr)}"
        body = request_body(kind, corr, data)
        if self.conn.lost is not None:
            # The server closes idle keep-alive connections (uvicorn: after 5 s); a
            # client that sat out a workload reconnects before it sends anything.
            self.conn = await HttpConnection.open(self.conn.host, self.conn.port)
            self.reconnects += 1
        http_status, raw = await self.conn.post(body)
        if http_status == 408 and b'"kind":"unknown"' in raw:
            # The server cut the connection off before this request (one opened and
            # left without a request past header_timeout: server/http/timeouts.py),
            # and its 408 was waiting in the socket.  The request was never read:
            # send it again on a new connection, as an HTTP client retries a request
            # its kept-alive connection lost.
            self.conn.close()
            self.conn = await HttpConnection.open(self.conn.host, self.conn.port)
            self.reconnects += 1
            http_status, raw = await self.conn.post(body)
        elapsed = self.conn.read_at - self.conn.sent_at
        reply = checked_reply(kind, corr, raw)
        if reply.head.status != http_status:
            raise BenchFailure(
                f"{kind}: HTTP status {http_status} differs from head.status {reply.head.status}"
            )
        return reply.head.status, msgspec.json.decode(reply.data), elapsed

    async def ok(self, kind: str, data: Any, expect: int = 200) -> tuple[Any, float]:
        """A call that must answer ``expect``; anything else fails the workload."""
        status, body, elapsed = await self.call(kind, data)
        if status != expect:
            raise BenchFailure(f"{kind} {data!r}: expected {expect}, got {status}: {body!r}")
        return body, elapsed

    def close(self) -> None:
        self.conn.close()


def promise_of(body: Any, kind: str) -> dict[str, Any]:
    """The ``promise`` record of a reply, or a failure naming what came instead."""
    if not isinstance(body, dict) or not isinstance(body.get("promise"), dict):
        raise BenchFailure(f"{kind}: reply has no promise record: {body!r}")
    promise: dict[str, Any] = body["promise"]
    return promise


def task_of(body: Any, kind: str) -> dict[str, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("task"), dict):
        raise BenchFailure(f"{kind}: reply has no task record: {body!r}")
    task: dict[str, Any] = body["task"]
    return task


def expect_state(record: dict[str, Any], state: str, what: str) -> None:
    if record.get("state") != state:
        raise BenchFailure(f"{what} {record.get('id')!r} is {record.get('state')!r}, not {state}")
