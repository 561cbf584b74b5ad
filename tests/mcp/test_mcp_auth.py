"""``troth mcp`` against ``troth serve --auth-publickey``: every call carries the
token, so an agent holding a prefix token sees and touches only its prefix — its own
promises created, read, searched and waited on; everything under another prefix
refused with the server's 403, nothing of it changed.  Over HTTP, the token the MCP
client sends itself is the one used."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from helpers.mcp_session import b64, call, http, refused, start_http, stdio
from helpers.sdk_env import Procs
from helpers.troth_process import LoggedServer

pytestmark = pytest.mark.timeout(120)

KEY = ed25519.Ed25519PrivateKey.generate()


def token(**claims: Any) -> str:
    return jwt.encode({"exp": int(time.time() + 3600), **claims}, KEY, algorithm="EdDSA")


ADMIN = token(role="admin")
ACME = token(prefix="acme-")
ACME_WORKERS_ONLY = token(prefix="acme-", groups=["acme-workers"])


@pytest.fixture
def guarded(procs: Procs, tmp_path: Path) -> LoggedServer:
    pub = tmp_path / "troth-public.pem"
    pub.write_bytes(
        KEY.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    srv = LoggedServer(procs, "sqlite", tmp_path / "troth.db", None, ["--auth-publickey", str(pub)])
    srv.start()
    return srv


def admin(srv: LoggedServer, kind: str, data: Any) -> tuple[int, Any]:
    head = {"corrId": f"admin-{time.monotonic_ns()}", "version": "2026-04-01", "auth": ADMIN}
    r = httpx.post(f"{srv.url}/", json={"kind": kind, "head": head, "data": data}, timeout=10)
    body = r.json()
    return int(body["head"]["status"]), body["data"]


def external(id: str) -> dict[str, Any]:
    return {"id": id, "timeoutAt": 10**13, "param": {}, "tags": {"resonate:external": "true"}}


def test_a_prefix_token_sees_and_touches_only_its_prefix(guarded: LoggedServer) -> None:
    for id in ("evil-secret", "acme-theirs"):
        assert admin(guarded, "promise.create", external(id))[0] == 200

    async def scenario() -> None:
        async with stdio(guarded.url, ACME) as client:
            made = await call(client, "promise-create", id="acme-approval", timeout="1h")
            assert made["promise"]["state"] == "pending"
            found = await call(client, "promise-search", state="pending")
            assert sorted(p["id"] for p in found["promises"]) == ["acme-approval", "acme-theirs"]

            # The wait: a listener on the process's own stream, the token on it too.
            answer: dict[str, Any] = {}
            async with anyio.create_task_group() as tg:

                async def wait() -> None:
                    answer.update(
                        await call(client, "promise-wait", id="acme-approval", timeout="60s")
                    )

                tg.start_soon(wait)
                with anyio.fail_after(20):
                    while guarded.answered("promise.register_listener", 200) < 1:
                        await anyio.sleep(0.05)
                status, _ = await anyio.to_thread.run_sync(
                    lambda: admin(
                        guarded,
                        "promise.settle",
                        {"id": "acme-approval", "state": "resolved", "value": {"data": b64("ok")}},
                    )
                )
                assert status == 200
            assert answer["settled"] is True and answer["decoded"]["value"] == "ok"

            # Another tenant's ids: the server's 403, as tool errors.
            for tool, args in (
                ("promise-get", {"id": "evil-secret"}),
                ("promise-create", {"id": "evil-new"}),
                ("promise-settle", {"id": "evil-secret", "resolution": "resolve"}),
                ("promise-wait", {"id": "evil-secret", "timeout": "5s"}),
                ("invoke", {"func": "f", "id": "evil-call"}),
                (
                    "schedule-create",
                    {"id": "evil-s", "cron": "* * * * *", "promiseId": "evil-{{.timestamp}}"},
                ),
                ("promise-search", {"tags": {"resonate:origin": "x"}, "state": "pending"}),
                ("explain", {"id": "acme-approval"}),
            ):
                result = await client.call_tool(tool, args)
                if tool == "promise-search":  # narrowed to the prefix, not refused
                    assert not result.is_error and result.structured_content["promises"] == []
                    continue
                text = "".join(getattr(c, "text", "") for c in result.content)
                assert result.is_error, (tool, text)
                assert result.structured_content["status"] == 403, (tool, text)
                assert " 403 " in text and "Traceback" not in text, (tool, text)

    anyio.run(scenario)
    # Nothing of the other tenant changed; nothing of theirs was made.
    assert admin(guarded, "promise.get", {"id": "evil-secret"})[1]["promise"]["state"] == "pending"
    for id in ("evil-new", "evil-call"):
        assert admin(guarded, "promise.get", {"id": id})[0] == 404


def test_a_token_whose_groups_exclude_the_listener_group(guarded: LoggedServer) -> None:
    async def scenario() -> None:
        async with stdio(guarded.url, ACME_WORKERS_ONLY) as client:
            await call(client, "promise-create", id="acme-w", timeout="1h")
            text, info = await refused(client, "promise-wait", id="acme-w", timeout="10s")
            assert info["status"] == 403 and "--listen-group" in text, text
        # With the listener on a group the token names, the wait works.
        async with stdio(guarded.url, ACME_WORKERS_ONLY, "--listen-group", "acme-workers") as c:
            late = await call(c, "promise-wait", id="acme-w", timeout="1s")
            assert late["settled"] is False and late["promise"]["state"] == "pending"

    anyio.run(scenario)


def test_over_http_the_clients_own_token_is_used(procs: Procs, guarded: LoggedServer) -> None:
    endpoint = start_http(procs, guarded.url)  # no token of its own

    async def scenario() -> None:
        async with http(endpoint, ACME) as client:
            await call(client, "promise-create", id="acme-h", timeout="1h")
            _, info = await refused(client, "promise-create", id="evil-h")
            assert info["status"] == 403
        async with http(endpoint) as anonymous:
            _, info = await refused(anonymous, "promise-get", id="acme-h")
            assert info["status"] == 401

    anyio.run(scenario)
    assert admin(guarded, "promise.get", {"id": "acme-h"})[0] == 200
    assert admin(guarded, "promise.get", {"id": "evil-h"})[0] == 404
