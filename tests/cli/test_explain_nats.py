"""``troth explain`` for tasks whose executes go to a ``nats://`` subject, against a
real troth and a real ``nats-server`` (``helpers/nats.py``; skipped without the binary).

NATS keeps no list of subscribers that troth could read, so explain reasons from what
the last publish met: "no responders" (nobody subscribes to the subject), no NATS
connection, no NATS configured at all, or a subscriber that took the message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import nats
import pytest

from helpers.nats import NatsServer, nats_server, subscribed
from helpers.support import RunningServer, running_server
from troth.cli.main import main
from troth.server.config import Settings

HOUR = 3_600_000


@pytest.fixture(scope="module")
def broker() -> Iterator[NatsServer]:
    with nats_server() as server:
        yield server


@pytest.fixture(scope="module")
def srv(broker: NatsServer) -> Iterator[RunningServer]:
    settings = Settings(store="memory", nats_url=broker.url)
    with running_server(settings) as server:
        wait("troth to connect to NATS", lambda: server.app.nats is not None and connected(server))
        yield server


def connected(server: RunningServer) -> bool:
    return server.app.nats is not None and server.app.nats.link.connected


def wait(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def targeted(server: RunningServer, id: str, target: str) -> None:
    data = {
        "id": id,
        "timeoutAt": time.time_ns() // 1_000_000 + HOUR,
        "param": {},
        "tags": {"resonate:target": target},
    }
    server.ok("promise.create", data)


def rows(server: RunningServer, task: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = server.client.get("/ops/outbox", params={"task": task}).json()[
        "rows"
    ]
    return found


def explained(server: RunningServer, id: str) -> dict[str, Any]:
    r = server.client.get("/ops/explain", params={"id": id})
    assert r.status_code == 200, r.text
    root: dict[str, Any] = r.json()["root"]
    return root


def test_no_subscriber_names_the_subject_and_the_no_responders(
    srv: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    target = "nats://resonate.recv.Lonely"  # case kept: NATS subjects are case-sensitive
    targeted(srv, "xn.lonely", target)
    wait(
        "a publish that met no responders",
        lambda: any(r["lastCode"] == "troth.nats.no_responders" for r in rows(srv, "xn.lonely")),
    )
    root = explained(srv, "xn.lonely")
    assert root["reason"] == "no_worker", root
    assert "no worker subscribed to nats subject `resonate.recv.Lonely`" in root["text"]
    assert "(last attempt " in root["text"] and ": no responders)" in root["text"]
    # "none delivered"; the other wording is still accepted from when a publish under
    # heavy load could be counted delivered before its "no responders" was read (closed
    # since: docs/performance-notes.md, "How a NATS send learns its outcome").
    assert "none delivered" in root["text"] or "the last ones undelivered" in root["text"]
    assert root["evidence"]["subject"] == "resonate.recv.Lonely"
    assert root["evidence"]["nats"] == "connected"
    # The CLI draws the same line.
    assert main(["explain", "xn.lonely", "--server", srv.url]) == 0
    out = capsys.readouterr().out
    assert "no worker subscribed to nats subject" in out and "resonate.recv.Lonely" in out


def test_a_subscriber_that_took_it_but_never_acquired(
    srv: RunningServer, broker: NatsServer
) -> None:
    subject = "resonate.recv.quiet"

    async def subscribed_while_created() -> None:
        nc = await nats.connect(broker.url)
        try:
            sub = await subscribed(nc, subject, "quiet")
            await asyncio.to_thread(targeted, srv, "xn.quiet", f"nats://{subject}")
            await sub.next_msg(timeout=20)  # received; never acquired
        finally:
            await nc.close()

    asyncio.run(subscribed_while_created())
    wait(
        "the row to complete",
        lambda: [r["state"] for r in rows(srv, "xn.quiet")] == ["completed"],
    )
    root = explained(srv, "xn.quiet")
    assert root["reason"] == "delivering", root
    assert "published to nats subject `resonate.recv.quiet`" in root["text"]
    assert "a subscriber took it, and no worker acquired it" in root["text"]


def test_without_nats_configured_the_address_is_undeliverable() -> None:
    with running_server(Settings(store="memory")) as server:
        targeted(server, "xn.off", "nats://resonate.recv.w")
        wait("the row to fail", lambda: [r["state"] for r in rows(server, "xn.off")] == ["failed"])
        root = explained(server, "xn.off")
    assert root["reason"] == "undeliverable", root
    assert "NATS is not configured (no nats_url)" in root["text"]
    assert "nats subject `resonate.recv.w`" in root["text"]
    assert root["evidence"]["nats"] == "off"


def test_nats_down_says_troth_is_not_connected() -> None:
    with nats_server() as own, running_server(Settings(store="memory", nats_url=own.url)) as server:
        wait("troth to connect to NATS", lambda: connected(server))
        own.stop()
        wait("troth to see NATS gone", lambda: not connected(server))
        targeted(server, "xn.down", "nats://resonate.recv.down")
        wait(
            "a publish refused for want of NATS",
            lambda: any(
                r["lastCode"] == "troth.nats.disconnected" for r in rows(server, "xn.down")
            ),
        )
        root = explained(server, "xn.down")
    assert root["reason"] == "nats_disconnected", root
    assert "troth is not connected to NATS" in root["text"]
    assert "nats subject `resonate.recv.down`" in root["text"]
    assert root["evidence"]["nats"] == "disconnected"
