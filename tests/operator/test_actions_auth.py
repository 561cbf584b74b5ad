"""The operator actions with auth on: only an admin token may cancel a workflow or
retry deliveries; any other token, or none, is refused and changes nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from helpers.support import RunningServer, running_server
from troth.server.config import Settings

KEY = ed25519.Ed25519PrivateKey.generate()
FAR = 10**13


def token(**claims: Any) -> str:
    return jwt.encode({"exp": int(time.time()) + 86_400, **claims}, KEY, algorithm="EdDSA")


ADMIN = token(role="admin")
TENANT = token(prefix="wf")  # its prefix covers the whole workflow: still not an operator


@pytest.fixture(scope="module")
def authed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    pub: Path = tmp_path_factory.mktemp("keys") / "pub.pem"
    pub.write_bytes(
        KEY.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    settings = Settings(store="memory", debug=True, access_log=False, auth_publickey=str(pub))
    with running_server(settings) as server:
        server.client.headers["Authorization"] = f"Bearer {ADMIN}"
        yield server


def post(server: RunningServer, path: str, body: Any, bearer: str | None) -> int:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    with_token = server.client.build_request("POST", path, json=body, headers=headers)
    if bearer is None:
        with_token.headers.pop("Authorization", None)
    return server.client.send(with_token).status_code


@pytest.mark.parametrize(
    ("path", "body"), [("/ops/cancel", {"id": "wf"}), ("/ops/outbox/retry", {})]
)
def test_only_an_admin_acts(authed: RunningServer, path: str, body: Any) -> None:
    authed.reset()
    authed.ok("promise.create", {"id": "wf", "timeoutAt": FAR, "tags": {"resonate:origin": "wf"}})
    before = authed.snap()
    assert post(authed, path, body, None) == 401
    assert post(authed, path, body, TENANT) == 403
    assert post(authed, path, body, "not-a-token") == 401
    assert authed.snap() == before
    assert post(authed, path, body, ADMIN) == 200
    if path == "/ops/cancel":
        state = authed.ok("promise.get", {"id": "wf"})["promise"]["state"]
        assert state == "rejected_canceled"


def test_only_an_admin_sets_or_reads_a_limit(authed: RunningServer) -> None:
    authed.reset()
    body = {"group": "fc", "concurrency": 2}
    for bearer, status in ((None, 401), (TENANT, 403), ("not-a-token", 401)):
        assert post(authed, "/ops/limits/set", body, bearer) == status
        assert post(authed, "/ops/limits/delete", {"group": "fc"}, bearer) == status
    assert authed.client.get("/ops/limits").json() == {"limits": []}
    tenant = authed.client.get("/ops/limits", headers={"Authorization": f"Bearer {TENANT}"})
    assert tenant.status_code == 403
    assert post(authed, "/ops/limits/set", body, ADMIN) == 200
    assert [x["group"] for x in authed.client.get("/ops/limits").json()["limits"]] == ["fc"]
