"""The ``troth.grants`` audit log: one line per lease granted, none otherwise."""

from __future__ import annotations

import logging
import re

import pytest

from helpers.support import RunningServer

FAR = 10**13
LINE = re.compile(r"acquired task=(\S+) version=(\d+) pid=(\S+) corrId=\S+ via=(\S+)")


def grants(caplog: pytest.LogCaptureFixture) -> list[tuple[str, ...]]:
    found = []
    for r in caplog.records:
        if r.name == "troth.grants":
            m = LINE.fullmatch(r.getMessage())
            assert m is not None, r.getMessage()
            found.append(m.groups())
    return found


def create_action(id: str) -> dict[str, object]:
    data = {"id": id, "timeoutAt": FAR, "tags": {"resonate:target": "poll://any@g"}}
    return {"kind": "promise.create", "head": {}, "data": data}


def test_acquire_and_create_grants_are_logged_refusals_are_not(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="troth.grants")
    tags = {"resonate:target": "poll://any@g"}
    server.ok("promise.create", {"id": "a", "timeoutAt": FAR, "tags": tags})
    server.ok("task.acquire", {"id": "a", "version": 0, "pid": "w1", "ttl": 60_000})
    status, _ = server.call("task.acquire", {"id": "a", "version": 0, "pid": "w2", "ttl": 60_000})
    assert status == 409
    server.ok("task.create", {"pid": "w3", "ttl": 60_000, "action": create_action("b")})
    status, _ = server.call(
        "task.create", {"pid": "w4", "ttl": 60_000, "action": create_action("b")}
    )
    assert status == 409  # already acquired: no second grant
    assert grants(caplog) == [("a", "1", "w1", "task.acquire"), ("b", "1", "w3", "task.create")]
