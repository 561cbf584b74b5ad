"""The published SDKs against ``troth serve --auth-publickey`` (docs/security.md).

Keys are made here (Ed25519), tokens signed here, and handed to the SDK processes
as ``RESONATE_TOKEN``, the way an operator sets them:

* an admin token runs the shared examples (``example.py``, ``example_ts.mjs``)
  unmodified, workers included — so every request and the SSE streams authenticate;
* the examples' fixed ids (``wf-…``, ``fan-…``, ``rpc-…``) have no common prefix,
  so a prefix token is tried on ``tenant.py`` / ``tenant_ts.mjs``: the same kinds of
  work (child call, durable sleep, rpc to a worker group, rpc fan-out, top-level
  rpc) with every id under ``acme-`` and only the groups the token's ``groups``
  claim names;
* another tenant's token gets 403 for everything it tries on ``acme-`` ids, and
  nothing of acme's changes; no token, an expired one, one signed by another key and
  an unsigned one get 401.

TypeScript SDK 0.11.5 sends an environment-only token on its POSTs but not on its
SSE stream; the unmodified TS example therefore runs with ``poll_token.mjs``
preloaded, and ``tenant_ts.mjs`` passes ``token:`` itself (docs/security.md).
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from helpers.sdk_env import EXAMPLE_PY, EXAMPLE_TS, SDK_PROGRAMS, NodeSdk, Proc, Procs, PythonSdk
from helpers.support import VERSION
from helpers.troth_process import ACCESS, LoggedServer

pytestmark = pytest.mark.timeout(180)

RUN_TIMEOUT = 70.0
KEY = ed25519.Ed25519PrivateKey.generate()
FOREIGN_KEY = ed25519.Ed25519PrivateKey.generate()

TENANT = ["workflow   -> hello world! 49", "rpc_fanout -> 30", "rpc        -> 81"]
PROBES = ["get", "create", "create_new", "resolve", "reject", "cancel"]
_corr = itertools.count(1)
#: A value as the SDKs encode one: base64 of its JSON.
QUESTION = base64.b64encode(json.dumps("ship it?").encode()).decode()


def token(key: Any = KEY, alg: str = "EdDSA", expires: float = 86_400, **claims: Any) -> str:
    return jwt.encode({"exp": int(time.time() + expires), **claims}, key, algorithm=alg)


ADMIN = token(role="admin")
ACME_GROUPS = ["acme-py-clients", "acme-py-workers", "acme-ts-clients", "acme-ts-workers"]
ACME = token(prefix="acme-", groups=ACME_GROUPS)
EVIL = token(prefix="evil-", groups=["evil-clients"])


@pytest.fixture
def store() -> str:
    """One backend: auth sits above the store (its rules are tested on all three in
    tests/wire/test_auth.py); this file is about the SDKs."""
    return "sqlite"


@pytest.fixture
def server(procs: Procs, tmp_path: Path) -> LoggedServer:
    pub = tmp_path / "troth-public.pem"
    pub.write_bytes(
        KEY.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    srv = LoggedServer(
        procs,
        "sqlite",
        tmp_path / "troth.db",
        None,
        ["--auth-publickey", str(pub), "--retry-timeout", "1000"],
    )
    srv.start()
    return srv


def call(srv: LoggedServer, kind: str, data: Any, tok: str = ADMIN) -> tuple[int, Any]:
    head = {"corrId": f"auth-{next(_corr)}", "version": VERSION, "auth": tok}
    r = httpx.post(f"{srv.url}/", json={"kind": kind, "head": head, "data": data}, timeout=10)
    body = r.json()
    assert r.status_code == body["head"]["status"]
    return int(body["head"]["status"]), body["data"]


def refusals(srv: LoggedServer) -> list[str]:
    """Access-log lines of 401 and 403 answers."""
    return [line for line in srv.log() if (m := ACCESS.search(line)) and m[2] in ("401", "403")]


def lines(proc: Proc) -> list[str]:
    return proc.out().splitlines()


def ts_with_env_token(node_sdk: NodeSdk, name: str, *args: str) -> list[str]:
    """``node_sdk.program`` with ``poll_token.mjs`` preloaded too (after the polyfill)."""
    argv = node_sdk.program(name, *args)
    return [*argv[:3], "--import", (SDK_PROGRAMS / "poll_token.mjs").as_uri(), *argv[3:]]


def test_python_example_with_an_admin_token(
    python_sdk: PythonSdk, procs: Procs, server: LoggedServer
) -> None:
    env = {"RESONATE_TOKEN": ADMIN}
    worker = procs.start(
        "py-worker", python_sdk.program("example.py", "worker", "--url", server.url), env
    )
    procs.wait_line(worker, r"^worker listening", 30)
    client = procs.start(
        "py-client", python_sdk.program("example.py", "client", "--url", server.url), env
    )
    procs.wait_exit(client, RUN_TIMEOUT)
    assert lines(client)[:-1] == EXAMPLE_PY, client.out()
    assert refusals(server) == [] and server.problems() == []


def test_typescript_example_with_an_admin_token(
    node_sdk: NodeSdk, procs: Procs, server: LoggedServer
) -> None:
    env = {"RESONATE_TOKEN": ADMIN}
    worker = procs.start(
        "ts-worker", ts_with_env_token(node_sdk, "example_ts.mjs", "worker", server.url), env
    )
    procs.wait_line(worker, r"^worker on ", 30)
    client = procs.start(
        "ts-client",
        ts_with_env_token(node_sdk, "example_ts.mjs", "client", server.url, "auth1"),
        env,
    )
    procs.wait_exit(client, RUN_TIMEOUT)
    assert lines(client)[:-1] == EXAMPLE_TS, client.out()
    assert refusals(server) == [] and server.problems() == []


def run_tenant(
    procs: Procs, server: LoggedServer, sdk: str, worker_argv: list[str], client_argv: list[str]
) -> None:
    env = {"RESONATE_TOKEN": ACME}
    worker = procs.start(f"{sdk}-tenant-worker", worker_argv, env)
    procs.wait_line(worker, r"^worker ready", 30)
    client = procs.start(f"{sdk}-tenant-client", client_argv, env)
    procs.wait_exit(client, RUN_TIMEOUT)
    assert lines(client) == TENANT, client.out() + client.err()
    assert refusals(server) == [] and server.problems() == []
    # Everything the run stored lies under the prefix: the search an admin sees
    # equals the one the tenant sees.
    _, everything = call(server, "promise.search", {"limit": 100})
    ids = {p["id"] for p in everything["promises"]}
    assert ids and all(i.startswith("acme-") for i in ids), ids


def test_python_tenant_with_a_prefix_token(
    python_sdk: PythonSdk, procs: Procs, server: LoggedServer
) -> None:
    program = python_sdk.program
    url = server.url
    run_tenant(
        procs,
        server,
        "py",
        program("tenant.py", "worker", "--url", url, "--group", "acme-py-workers"),
        program(
            "tenant.py",
            *["client", "--url", url, "--group", "acme-py-clients"],
            *["--workers", "acme-py-workers", "--prefix", "acme-", "--suffix", "p1"],
        ),
    )


def test_typescript_tenant_with_a_prefix_token(
    node_sdk: NodeSdk, procs: Procs, server: LoggedServer
) -> None:
    program = node_sdk.program
    url = server.url
    run_tenant(
        procs,
        server,
        "ts",
        program("tenant_ts.mjs", "worker", url, "acme-ts-workers"),
        program(
            "tenant_ts.mjs", "client", url, "acme-ts-clients", "acme-ts-workers", "acme-", "t1"
        ),
    )


def probe(
    procs: Procs,
    python_sdk: PythonSdk,
    server: LoggedServer,
    name: str,
    tok: str | None,
    group: str,
    promise: str,
) -> Proc:
    env = {"RESONATE_TOKEN": tok} if tok is not None else {}
    argv = python_sdk.program(
        "tenant.py", "probe", "--url", server.url, "--group", group, "--promise", promise
    )
    return procs.start(name, argv, env)


def outcomes(procs: Procs, proc: Proc) -> dict[str, str]:
    out = procs.wait_exit(proc, RUN_TIMEOUT)
    found = dict(re.findall(r"^(\w+) -> (.+)$", out, re.M))
    assert list(found) == PROBES, out + proc.err()
    return found


def test_another_tenant_is_refused_403_and_changes_nothing(
    python_sdk: PythonSdk, procs: Procs, server: LoggedServer
) -> None:
    far = int(time.time() * 1000) + 3_600_000
    status, _ = call(
        server,
        "promise.create",
        {"id": "acme-ext", "timeoutAt": far, "param": {"data": QUESTION}, "tags": {}},
        ACME,
    )
    assert status == 200
    before = call(server, "promise.search", {"limit": 100})
    intruder = probe(procs, python_sdk, server, "evil", EVIL, "evil-clients", "acme-ext")
    assert outcomes(procs, intruder) == dict.fromkeys(PROBES, "403")
    assert call(server, "promise.search", {"limit": 100}) == before
    assert call(server, "promise.get", {"id": "acme-ext-new"})[0] == 404
    _, got = call(server, "promise.get", {"id": "acme-ext"})
    assert got["promise"]["state"] == "pending"
    # The owner's own token is served the same requests (the probe is not wrong).
    owner = probe(procs, python_sdk, server, "owner", ACME, "acme-py-clients", "acme-ext")
    assert outcomes(procs, owner)["get"] == "ok pending"


@pytest.mark.parametrize(
    "case",
    ["no token", "expired", "another key", "unsigned (alg none)"],
)
def test_no_expired_foreign_or_unsigned_tokens_are_refused_401(
    python_sdk: PythonSdk, procs: Procs, server: LoggedServer, case: str
) -> None:
    tok = {
        "no token": None,
        "expired": token(role="admin", expires=-3600),
        "another key": token(FOREIGN_KEY, role="admin"),
        "unsigned (alg none)": token(None, "none", role="admin"),
    }[case]
    far = int(time.time() * 1000) + 3_600_000
    assert call(server, "promise.create", {"id": "x", "timeoutAt": far, "tags": {}})[0] == 200
    before = call(server, "promise.search", {"limit": 100})
    refused = probe(procs, python_sdk, server, "probe", tok, "default", "x")
    assert outcomes(procs, refused) == dict.fromkeys(PROBES, "401")
    assert call(server, "promise.search", {"limit": 100}) == before


def test_typescript_sdk_sends_an_environment_token_on_posts_only(
    node_sdk: NodeSdk, procs: Procs, server: LoggedServer
) -> None:
    """Why ``poll_token.mjs`` exists: without it, SDK 0.11.5's SSE stream goes out
    without the token from ``RESONATE_TOKEN`` and is refused (401), so the worker
    never hears an execute; with it, the same example runs (the admin test above).
    When a newer SDK fails this test, its stream carries the token: drop the shim."""
    worker = procs.start(
        "ts-worker",
        node_sdk.program("example_ts.mjs", "worker", server.url),
        {"RESONATE_TOKEN": ADMIN},
    )
    procs.wait_for(
        "the SDK to report its SSE stream refused",
        lambda: "SSE connection error" in worker.out() + worker.err(),
        20,
    )
