"""NATS (docs/operations.md, "NATS"): requests over NATS answered exactly as
``POST /`` answers them, and ``nats://`` delivery, against a real ``nats-server``
started for this module (``helpers/nats.py``; skipped without the binary).

The client side here does what the SDKs' connector (``resonate-nats`` 0.8.0) does:
publish the envelope to ``resonate.requests.{base64url(origin)}`` with a
``Resonate-Reply-To`` header naming an inbox, and wait for one message there.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jwt
import msgspec
import nats
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from helpers.nats import NatsServer, nats_server, subscribed
from helpers.support import VERSION, RunningServer, running_server
from troth.server.config import ConfigError, Settings, load
from troth.server.ingress.nats import origin_of

FAR = 10**13
_corr = itertools.count(1)


@pytest.fixture(scope="module")
def broker() -> Iterator[NatsServer]:
    with nats_server() as server:
        yield server


def wait(what: str, check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def subject_for(origin: str, prefix: str = "resonate") -> str:
    token = base64.urlsafe_b64encode(origin.encode()).rstrip(b"=").decode()
    return f"{prefix}.requests.{token}"


def envelope(kind: str, data: Any, **head: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "head": {"corrId": f"n-{next(_corr)}", "version": VERSION, **head},
        "data": data,
    }


async def ask(
    url: str,
    body: bytes,
    origin: str = "default",
    *,
    reply_header: bool = True,
    prefix: str = "resonate",
) -> dict[str, Any]:
    """One request the way the connector sends it; the answer envelope."""
    nc = await nats.connect(url)
    try:
        subject = subject_for(origin, prefix)
        if not reply_header:  # the plain NATS request/reply form
            msg = await nc.request(subject, body, timeout=10)
            answer: dict[str, Any] = json.loads(msg.data)
            return answer
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox, max_msgs=1)
        await nc.publish(subject, body, headers={"Resonate-Reply-To": inbox})
        msg = await sub.next_msg(timeout=10)
        answer = json.loads(msg.data)
        return answer
    finally:
        await nc.close()


def over_nats(url: str, kind: str, data: Any, **head: Any) -> tuple[int, Any]:
    env = envelope(kind, data, **head)
    answer = asyncio.run(ask(url, msgspec.json.encode(env), data.get("id", "default")))
    assert answer["kind"] == kind and answer["head"]["corrId"] == env["head"]["corrId"], answer
    return answer["head"]["status"], answer["data"]


@pytest.fixture(scope="module")
def srv(broker: NatsServer) -> Iterator[RunningServer]:
    settings = Settings(store="memory", access_log=True, nats_url=broker.url)
    with running_server(settings) as server:
        wait(
            "troth to subscribe",
            lambda: server.app.nats is not None and server.app.nats.sub is not None,
        )
        yield server


# --------------------------------------------------------------------------- requests


def test_create_get_settle_over_nats_answer_as_http_does(
    srv: RunningServer, broker: NatsServer
) -> None:
    create = {
        "id": "n.create",
        "timeoutAt": FAR,
        "param": {"headers": {}, "data": "eA=="},
        "tags": {"a": "b"},
    }
    status, data = over_nats(broker.url, "promise.create", create)
    assert status == 200 and data["promise"]["state"] == "pending"
    status, again = over_nats(broker.url, "promise.create", create)
    assert status == 200 and again == data  # idempotent, as over HTTP
    status, got = over_nats(broker.url, "promise.get", {"id": "n.create"})
    assert status == 200
    assert got == srv.ok("promise.get", {"id": "n.create"})  # the same record over HTTP
    settle = {"id": "n.create", "state": "resolved", "value": {"headers": {}, "data": "eQ=="}}
    status, settled = over_nats(broker.url, "promise.settle", settle)
    assert status == 200 and settled["promise"]["state"] == "resolved"
    assert srv.ok("promise.get", {"id": "n.create"})["promise"]["state"] == "resolved"
    status, _ = over_nats(broker.url, "promise.get", {"id": "n.nothing"})
    assert status == 404


def test_the_reply_subject_is_used_when_the_header_is_absent(
    srv: RunningServer, broker: NatsServer
) -> None:
    env = envelope("promise.get", {"id": "n.none"})
    answer = asyncio.run(ask(broker.url, msgspec.json.encode(env), reply_header=False))
    assert answer["head"]["status"] == 404 and answer["head"]["corrId"] == env["head"]["corrId"]


def test_a_bad_envelope_is_a_400_envelope_echoing_what_it_could(
    broker: NatsServer, srv: RunningServer
) -> None:
    answer = asyncio.run(ask(broker.url, b'{"kind": "promise.get", "head": {"corrId": "x-1"'))
    assert answer["head"]["status"] == 400 and answer["kind"] == "unknown"
    answer = asyncio.run(ask(broker.url, b'{"kind": "promise.get", "head": {"corrId": "x-1"}}'))
    assert answer["head"]["status"] == 400 and answer["kind"] == "promise.get"
    assert answer["head"]["corrId"] == "x-1"
    bad = envelope("promise.create", {"id": "n.bad", "timeoutAt": "soon"})
    answer = asyncio.run(ask(broker.url, msgspec.json.encode(bad)))
    assert answer["head"]["status"] == 400 and "timeoutAt" in answer["data"]
    assert srv.call("promise.get", {"id": "n.bad"})[0] == 404  # nothing was stored


def test_the_origin_is_read_from_the_subject(
    srv: RunningServer, broker: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="troth.access"):
        env = envelope("promise.get", {"id": "wf:1.2"})
        asyncio.run(ask(broker.url, msgspec.json.encode(env), origin="wf:1"))
        wait("the access line", lambda: env["head"]["corrId"] in caplog.text)
    line = next(r.getMessage() for r in caplog.records if env["head"]["corrId"] in r.getMessage())
    assert line.endswith("via=nats origin=wf:1"), line
    assert origin_of(subject_for("a.b c/ü"), "resonate") == "a.b c/ü"
    assert origin_of("resonate.requests.!!", "resonate") is None
    assert origin_of("other.requests.YQ", "resonate") is None


def test_requests_are_served_concurrently_and_share_commits(
    srv: RunningServer, broker: NatsServer
) -> None:
    async def many() -> list[dict[str, Any]]:
        nc = await nats.connect(broker.url)
        try:
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox + ".*")
            for i in range(200):
                env = envelope("promise.create", {"id": f"n.many.{i}", "timeoutAt": FAR})
                await nc.publish(
                    subject_for(f"n.many.{i}"),
                    msgspec.json.encode(env),
                    headers={"Resonate-Reply-To": f"{inbox}.{i}"},
                )
            return [json.loads((await sub.next_msg(timeout=10)).data) for _ in range(200)]
        finally:
            await nc.close()

    def batches() -> float:
        return srv.app.metrics.counters.get("troth_commit_batches_total", {}).get((), 0)

    before = batches()
    answers = asyncio.run(many())
    assert sorted(a["head"]["status"] for a in answers) == [200] * 200
    assert batches() - before < 200, (
        "a commit per request: NATS requests were not served concurrently"
    )


def test_an_answer_over_max_payload_is_an_error_envelope(tmp_path: Any) -> None:
    with nats_server(max_payload=4096) as small:
        settings = Settings(store="memory", access_log=False, nats_url=small.url)
        with running_server(settings) as server:
            wait(
                "subscribed",
                lambda: server.app.nats is not None and server.app.nats.sub is not None,
            )
            for i in range(8):
                param = {"headers": {}, "data": "x" * 1000}
                server.ok("promise.create", {"id": f"big.{i}", "timeoutAt": FAR, "param": param})
            env = envelope("promise.search", {"state": "pending"})
            answer = asyncio.run(ask(small.url, msgspec.json.encode(env)))
            assert answer["head"]["status"] == 500, answer
            assert "max_payload" in answer["data"] and "4096" in answer["data"]
            assert answer["head"]["corrId"] == env["head"]["corrId"]


# ------------------------------------------------------------------------------ auth

KEY = ed25519.Ed25519PrivateKey.generate()


def test_auth_applies_to_nats_requests(tmp_path: Any, broker: NatsServer) -> None:
    pub = tmp_path / "pub.pem"
    pub.write_bytes(
        KEY.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    prefix = "authed"
    settings = Settings(
        store="memory",
        access_log=False,
        auth_publickey=str(pub),
        nats_url=broker.url,
        nats_prefix=prefix,
    )
    with running_server(settings) as server:
        wait("subscribed", lambda: server.app.nats is not None and server.app.nats.sub is not None)

        def call(data: dict[str, Any], tok: str | None) -> dict[str, Any]:
            head = {"auth": tok} if tok is not None else {}
            env = envelope("promise.create", data, **head)
            answer: dict[str, Any] = asyncio.run(
                ask(broker.url, msgspec.json.encode(env), prefix=prefix)
            )
            return answer

        assert call({"id": "a.1", "timeoutAt": FAR}, None)["head"]["status"] == 401
        assert call({"id": "a.1", "timeoutAt": FAR}, "not-a-token")["head"]["status"] == 401
        tenant = jwt.encode(
            {"exp": int(time.time()) + 86_400, "prefix": "a."}, KEY, algorithm="EdDSA"
        )
        assert call({"id": "b.1", "timeoutAt": FAR}, tenant)["head"]["status"] == 403
        assert call({"id": "a.1", "timeoutAt": FAR}, tenant)["head"]["status"] == 200


def test_settings() -> None:
    assert Settings().nats_url == "" and Settings().nats_prefix == "resonate"
    assert (
        load(
            environ={"TROTH_NATS_URL": "nats://h:4222", "TROTH_NATS_PREFIX": "acme.resonate"}
        ).nats_prefix
        == "acme.resonate"
    )
    for bad in ("", "a..b", "a.*", "a.>", "a b"):
        with pytest.raises(ConfigError):
            Settings(nats_prefix=bad)


# -------------------------------------------------------------------------- delivery


async def collect(
    url: str,
    subject: str,
    until: Callable[[list[dict[str, Any]]], bool],
    act: Callable[[], None],
    queue: str = "",
    timeout: float = 10.0,
) -> list[dict[str, Any]]:
    """Subscribe to ``subject``, then run ``act`` (in a thread), and gather the
    messages until ``until`` holds."""
    nc = await nats.connect(url)
    seen: list[dict[str, Any]] = []
    try:
        sub = await subscribed(nc, subject, queue)
        await asyncio.to_thread(act)
        deadline = time.monotonic() + timeout
        while not until(seen):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; saw {seen}"
            msg = await sub.next_msg(timeout=left)
            seen.append(
                {"subject": msg.subject, "body": json.loads(msg.data), "headers": msg.headers}
            )
        return seen
    finally:
        await nc.close()


def outbox_rows(server: RunningServer, task: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = server.client.get("/ops/outbox", params={"task": task}).json()[
        "rows"
    ]
    return rows


def test_execute_to_a_nats_address_reaches_the_subscriber(
    srv: RunningServer, broker: NatsServer
) -> None:
    target = "nats://resonate.recv.Workers"  # the case as given: subjects are case-sensitive
    seen = asyncio.run(
        collect(
            broker.url,
            "resonate.recv.Workers",
            lambda s: len(s) >= 1,
            lambda: srv.ok(
                "promise.create",
                {"id": "n.exec", "timeoutAt": FAR, "tags": {"resonate:target": target}},
            ),
            queue="Workers",
        )
    )
    body = seen[0]["body"]
    assert body == {
        "kind": "execute",
        "head": {"serverUrl": srv.settings.url},
        "data": {"task": {"id": "n.exec", "version": 0}},
    }
    assert seen[0]["headers"]["Idempotency-Key"]
    wait(
        "the row completed",
        lambda: [r["state"] for r in outbox_rows(srv, "n.exec")] == ["completed"],
    )


def test_no_subscriber_is_retryable_and_delivered_once_one_subscribes(
    srv: RunningServer, broker: NatsServer
) -> None:
    target = "nats://resonate.recv.late"
    srv.ok(
        "promise.create", {"id": "n.late", "timeoutAt": FAR, "tags": {"resonate:target": target}}
    )
    wait(
        "a no-responders retry",
        lambda: any(
            r["lastCode"] == "troth.nats.no_responders" and r["state"] == "pending"
            for r in outbox_rows(srv, "n.late")
        ),
    )
    # The backoff is 1 s after the first attempt: a subscriber arriving now gets it.
    seen = asyncio.run(
        collect(broker.url, "resonate.recv.late", lambda s: len(s) >= 1, lambda: None)
    )
    assert seen[0]["body"]["data"]["task"]["id"] == "n.late"


def test_a_nats_listener_gets_the_unblock(srv: RunningServer, broker: NatsServer) -> None:
    srv.ok(
        "promise.create",
        {"id": "n.listened", "timeoutAt": FAR, "tags": {"resonate:external": "true"}},
    )
    listener = "nats://resonate.recv.group.pid7"
    srv.ok("promise.register_listener", {"awaited": "n.listened", "address": listener})
    assert (
        srv.call("promise.register_listener", {"awaited": "n.listened", "address": "nats://a b"})[0]
        == 400
    )
    assert (
        srv.call("promise.register_listener", {"awaited": "n.listened", "address": "nats://"})[0]
        == 400
    )
    seen = asyncio.run(
        collect(
            broker.url,
            "resonate.recv.group.pid7",
            lambda s: len(s) >= 1,
            lambda: srv.ok(
                "promise.settle", {"id": "n.listened", "state": "resolved", "value": {}}
            ),
        )
    )
    assert seen[0]["body"]["kind"] == "unblock"
    assert seen[0]["body"]["data"]["promise"]["id"] == "n.listened"


def test_without_nats_a_nats_address_is_logged_counted_and_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(store="memory", access_log=False)
    with (
        caplog.at_level(logging.WARNING, logger="troth.delivery"),
        running_server(settings) as server,
    ):
        server.ok(
            "promise.create",
            {
                "id": "n.off",
                "timeoutAt": FAR,
                "tags": {"resonate:target": "nats://resonate.recv.w"},
            },
        )
        wait(
            "the row failed",
            lambda: [r["state"] for r in outbox_rows(server, "n.off")] == ["failed"],
        )
        assert outbox_rows(server, "n.off")[0]["lastCode"] == "troth.nats.not_configured"
        metrics = server.client.get("/metrics").text
        assert 'troth_undeliverable_total{code="troth.nats.not_configured"} 1' in metrics
        explained = server.client.get("/ops/explain", params={"id": "n.off"}).text
        assert "no nats_url" in explained
    assert any(
        "cannot deliver to nats://resonate.recv.w: no nats_url is configured" in r.getMessage()
        for r in caplog.records
    )


def test_nats_down_is_retryable_and_troth_reconnects(
    broker: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    with nats_server() as own:
        settings = Settings(store="memory", access_log=False, nats_url=own.url)
        with (
            caplog.at_level(logging.WARNING, logger="troth.nats"),
            running_server(settings) as server,
        ):
            wait(
                "subscribed",
                lambda: server.app.nats is not None and server.app.nats.sub is not None,
            )
            own.stop()
            wait("troth to notice", lambda: "NATS connection lost" in caplog.text)
            server.ok(
                "promise.create",
                {
                    "id": "n.down",
                    "timeoutAt": FAR,
                    "tags": {"resonate:target": "nats://resonate.recv.down"},
                },
            )
            wait(
                "a disconnected retry",
                lambda: any(
                    r["lastCode"] == "troth.nats.disconnected"
                    for r in outbox_rows(server, "n.down")
                ),
            )
            assert server.client.get("/health").status_code == 200  # HTTP goes on
            own.restart()
            wait("troth to reconnect", lambda: "NATS reconnected" in caplog.text, timeout=15)
            status, _ = over_nats(own.url, "promise.get", {"id": "n.down"})
            assert status == 200  # requests over NATS again, on the re-made subscription


def test_any_node_may_claim_nats_rows_on_postgres() -> None:
    """The routed claim (store/postgres queries.sql ``claim_routed``) gives rows whose
    ``dest_group`` is NULL to any node, as http(s) rows; a ``nats://`` row has none."""
    from troth.store.sql.codec import RowCodec

    assert RowCodec.destination("nats://resonate.recv.workers.abc") == (None, None, None)
    assert RowCodec.destination("poll://any@workers/abc") == ("any", "workers", "abc")


def test_concurrent_sends_share_flushes_and_each_learns_its_own_no_responders(
    broker: NatsServer,
) -> None:
    """60 sends at once, every other one to a subject nobody subscribes to: each
    subscribed send is Completed and received once, each other one is Retryable with
    "no responders"; they share one reply subscription and far fewer flushes than
    sends (a flush begun after a publish covers every publish made before it)."""
    from troth.outbox.types import Completed, Retryable
    from troth.transport.nats import NatsLink, NatsSender

    async def scenario() -> None:
        link = NatsLink(broker.url)
        link.start()
        await asyncio.wait_for(link.ready.wait(), 10)
        worker = await nats.connect(broker.url)
        got = await subscribed(worker, "batched.here")
        flushes = 0
        real_flush = link.client.flush

        async def counted(timeout: int = 10) -> None:
            nonlocal flushes
            flushes += 1
            await real_flush(timeout)

        link.client.flush = counted  # type: ignore[method-assign]
        sender = NatsSender(link, "http://troth")
        try:
            rows = [
                _execute_to(i, f"batched.{'here' if i % 2 == 0 else 'nobody'}") for i in range(60)
            ]
            outcomes = await asyncio.gather(*(sender.send(r) for r in rows))
            for i, outcome in enumerate(outcomes):
                if i % 2 == 0:
                    assert isinstance(outcome, Completed), (i, outcome)
                else:
                    assert isinstance(outcome, Retryable), (i, outcome)
                    assert outcome.code == "troth.nats.no_responders"
            assert 1 <= flushes <= 10, flushes
            received = []
            while len(received) < 30:
                msg = await got.next_msg(timeout=5)
                received.append(json.loads(msg.data)["data"]["task"]["id"])
            assert sorted(received) == sorted(f"t{i}" for i in range(0, 60, 2))
            assert len(link.client._subs) == 1  # the node's one reply subscription
        finally:
            await worker.close()
            await link.close()

    asyncio.run(scenario())


def _execute_to(i: int, subject: str) -> Any:
    from troth.outbox.rows import OutboxRow
    from troth.protocol.records import Execute, OutboxEntry

    return OutboxRow(i, OutboxEntry(f"nats://{subject}", Execute(f"t{i}", 1)), 0)


def test_a_publish_still_in_nats_py_buffer_when_the_flush_begins_learns_no_responders(
    broker: NatsServer,
) -> None:
    """nats-py writes a flush's PING straight to the socket while publishes wait in its
    buffer for its flusher task.  Here that task is held up in ``drain()`` (a socket
    the kernel drains slowly: the one fault injected) while a second send publishes to
    a subject nobody subscribes to, during the first send's flush: its own flush must
    still come after its publish on the wire and so learn "no responders", not report
    it delivered."""
    from troth.outbox.types import Completed, Retryable
    from troth.transport.nats import NatsLink, NatsSender

    async def scenario() -> None:
        link = NatsLink(broker.url)
        link.start()
        await asyncio.wait_for(link.ready.wait(), 10)
        worker = await nats.connect(broker.url)
        await subscribed(worker, "held.here")
        sender = NatsSender(link, "http://troth")
        transport = link.client._transport
        assert transport is not None
        real_drain = transport.drain
        held = asyncio.Event()

        async def slow_drain() -> None:
            held.set()
            await asyncio.sleep(0.5)
            await real_drain()

        first_ping = asyncio.Event()
        real_flush = link.client.flush

        async def noted(timeout: int = 10) -> None:
            first_ping.set()
            await real_flush(timeout)

        try:
            await sender.send(_execute_to(0, "held.here"))  # the reply subscription
            transport.drain = slow_drain  # type: ignore[method-assign]
            link.client.flush = noted  # type: ignore[method-assign]
            first = asyncio.create_task(sender.send(_execute_to(1, "held.here")))
            await first_ping.wait()  # the first send's flush is under way ...
            await held.wait()  # ... and nats-py's flusher is held in drain()
            second = await sender.send(_execute_to(2, "held.nobody"))
            assert isinstance(second, Retryable), second
            assert second.code == "troth.nats.no_responders"
            assert isinstance(await first, Completed)
        finally:
            await worker.close()
            await link.close()

    asyncio.run(scenario())


def test_a_send_whose_connection_was_lost_before_its_flush_is_unknown() -> None:
    """The NATS server freezes (SIGSTOP) before a send, so its publish sits unread in
    the socket; the server is killed and started again before the send's flush.  The
    flush then goes over the new connection and proves nothing about the publish, so
    the send is Unknown (``troth.nats.flush_failed``: the reconciler decides), not
    Completed; the next send, on the new connection, is Completed."""
    import signal

    from troth.outbox.types import Completed, Unknown
    from troth.transport.nats import NatsLink, NatsSender

    async def scenario(server: NatsServer) -> None:
        link = NatsLink(server.url, reconnect_wait=0.1)
        link.start()
        await asyncio.wait_for(link.ready.wait(), 10)
        worker = await nats.connect(server.url, reconnect_time_wait=0.1)
        got = await subscribed(worker, "lost.anyone")
        sender = NatsSender(link, "http://troth")
        await sender.send(_execute_to(0, "lost.anyone"))  # the reply subscription
        await got.next_msg(timeout=5)
        real_flush = link.client.flush
        restarted = False

        def kill_and_restart() -> None:
            server.process.kill()
            server.process.wait(10)
            server.restart()

        async def after_a_restart(timeout: int = 10) -> None:
            nonlocal restarted
            if not restarted:
                restarted = True
                before = link.client.stats["reconnects"]
                await asyncio.to_thread(kill_and_restart)
                deadline = time.monotonic() + 20
                while link.client.stats["reconnects"] == before:
                    assert time.monotonic() < deadline, "nats-py did not reconnect"
                    await asyncio.sleep(0.05)
            await real_flush(timeout)

        try:
            link.client.flush = after_a_restart  # type: ignore[method-assign]
            server.process.send_signal(signal.SIGSTOP)
            stat = Path(f"/proc/{server.process.pid}/stat")
            while stat.read_text().rpartition(")")[2].split()[0] != "T":
                await asyncio.sleep(0.01)  # every thread of it stopped
            lost = await sender.send(_execute_to(1, "lost.anyone"))
            assert isinstance(lost, Unknown), lost
            assert lost.code == "troth.nats.flush_failed"
            deadline = time.monotonic() + 20
            while not worker.is_connected:  # the worker re-subscribes as it reconnects
                assert time.monotonic() < deadline, "the worker did not reconnect"
                await asyncio.sleep(0.05)
            await worker.flush()
            await worker.flush()
            assert isinstance(await sender.send(_execute_to(2, "lost.anyone")), Completed)
            msg = await got.next_msg(timeout=5)
            assert json.loads(msg.data)["data"]["task"]["id"] == "t2"  # t1 never arrived
        finally:
            await worker.close()
            await link.close()

    with nats_server() as server:
        asyncio.run(scenario(server))
