"""CORS for browser clients (``cors_allow_origins``, server/http/cors.py), over a real
socket: preflight ``OPTIONS`` on ``/``, ``/poll/…`` and ``/health``; the allow-origin
headers on the answers of ``POST /``, ``GET /poll`` and ``GET /health`` for an
allowed ``Origin`` only; ``*``; off by default; before auth (a preflight has no
token, and a 401 must reach the page)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from helpers.support import VERSION, RunningServer, running_server
from troth.server.config import ConfigError, Settings, load

UI = "https://ui.example.com"
OTHER = "https://evil.example.net"
PATHS = ["/", "/poll/g/w", "/health"]
ACAO = "access-control-allow-origin"


@pytest.fixture(scope="module")
def cors() -> Iterator[RunningServer]:
    settings = Settings(
        store="memory", access_log=False, cors_allow_origins=f"{UI}, http://localhost:3000"
    )
    with running_server(settings) as server:
        yield server


def preflight(srv: RunningServer, path: str, origin: str | None) -> httpx.Response:
    headers = {
        "access-control-request-method": "POST" if path == "/" else "GET",
        "access-control-request-headers": "authorization, content-type",
    }
    if origin is not None:
        headers["origin"] = origin
    return srv.client.options(path, headers=headers)


def get_promise(srv: RunningServer, origin: str | None, **headers: str) -> httpx.Response:
    if origin is not None:
        headers["origin"] = origin
    envelope = {
        "kind": "promise.get",
        "head": {"corrId": "c", "version": VERSION},
        "data": {"id": "x"},
    }
    return srv.client.post("/", json=envelope, headers=headers)


def poll_headers(srv: RunningServer, origin: str | None, **headers: str) -> httpx.Response:
    """The response head of ``GET /poll/g/w`` (the stream is closed right after)."""
    if origin is not None:
        headers["origin"] = origin
    with srv.client.stream("GET", "/poll/g/w", headers=headers) as r:
        return r


@pytest.mark.parametrize("path", PATHS)
def test_preflight_from_an_allowed_origin(cors: RunningServer, path: str) -> None:
    r = preflight(cors, path, UI)
    assert r.status_code == 204
    assert r.headers[ACAO] == UI
    assert r.headers["vary"] == "Origin"
    assert set(r.headers["access-control-allow-methods"].split(", ")) >= {"GET", "POST"}
    allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
    assert allowed >= {"authorization", "content-type"}
    assert int(r.headers["access-control-max-age"]) > 0
    assert preflight(cors, path, "http://localhost:3000").headers[ACAO] == "http://localhost:3000"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("origin", [OTHER, None, "https://ui.example.com.evil.net", "null"])
def test_preflight_from_another_origin_gets_no_cors_header(
    cors: RunningServer, path: str, origin: str | None
) -> None:
    r = preflight(cors, path, origin)
    assert r.status_code == 204
    assert not [h for h in r.headers if h.startswith("access-control-")]


def test_answers_carry_the_origin_only_for_an_allowed_one(cors: RunningServer) -> None:
    r = get_promise(cors, UI)
    assert r.status_code == 404 and r.json()["head"]["status"] == 404  # the envelope, as ever
    assert (r.headers[ACAO], r.headers["vary"]) == (UI, "Origin")
    r = cors.client.get("/health", headers={"origin": UI})
    assert r.status_code == 200 and r.headers[ACAO] == UI
    r = poll_headers(cors, UI, accept="text/event-stream")
    assert r.status_code == 200 and r.headers[ACAO] == UI
    assert r.headers["content-type"] == "text/event-stream"
    for origin in (OTHER, None):
        for response in (
            get_promise(cors, origin),
            cors.client.get("/health", headers={"origin": origin} if origin else {}),
            poll_headers(cors, origin),
        ):
            assert ACAO not in response.headers
    # Paths browsers have no business with stay as they are.
    assert ACAO not in cors.client.get("/ready", headers={"origin": UI}).headers
    assert cors.client.options("/ready", headers={"origin": UI}).status_code != 204


def test_a_wildcard_allows_every_origin() -> None:
    with running_server(Settings(store="memory", access_log=False, cors_allow_origins="*")) as srv:
        r = preflight(srv, "/", OTHER)
        assert r.status_code == 204 and r.headers[ACAO] == "*"
        assert get_promise(srv, OTHER).headers[ACAO] == "*"
        assert ACAO not in get_promise(srv, None).headers


def test_cors_is_off_by_default(server: RunningServer) -> None:
    r = preflight(server, "/", UI)
    assert r.status_code == 405  # POST / only, as before
    assert ACAO not in r.headers
    assert ACAO not in server.client.get("/health", headers={"origin": UI}).headers


def test_preflight_needs_no_token_and_refusals_reach_the_page(tmp_path: Path) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    pub = tmp_path / "pub.pem"
    pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    settings = Settings(
        store="memory", access_log=False, auth_publickey=str(pub), cors_allow_origins=UI
    )
    with running_server(settings) as srv:
        for path in PATHS:
            r = preflight(srv, path, UI)
            assert r.status_code == 204 and r.headers[ACAO] == UI
        refused = get_promise(srv, UI)
        assert refused.status_code == 401 and refused.headers[ACAO] == UI
        r = poll_headers(srv, UI)
        assert r.status_code == 401 and r.headers[ACAO] == UI
        admin = jwt.encode({"exp": int(time.time()) + 86_400, "role": "admin"}, key, "EdDSA")
        served = get_promise(srv, UI, authorization=f"Bearer {admin}")
        assert served.status_code == 404 and served.headers[ACAO] == UI


def test_origins_in_every_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "troth.toml").write_text(f'cors_allow_origins = ["{UI}", "http://x:8080/"]\n')
    assert load(environ={}).cors_allow_origins == f"{UI},http://x:8080/"
    env = load(environ={"TROTH_CORS_ALLOW_ORIGINS": "*"})
    assert env.cors_allow_origins == "*"
    with pytest.raises(ConfigError, match="is not an origin"):
        load(environ={"TROTH_CORS_ALLOW_ORIGINS": "https://ui.example.com/app"})
    with pytest.raises(ConfigError, match="is not an origin"):
        load(environ={"TROTH_CORS_ALLOW_ORIGINS": "ui.example.com"})
