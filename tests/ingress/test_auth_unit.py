"""The authenticator alone: every key type and algorithm, the claims it requires, the
insecure mode, the cache, and the authorization rules (server/ingress/auth.py).  Keys are
generated here, never committed."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from pathlib import Path
from typing import Any

import jwt
import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from troth.cli.main import main
from troth.protocol import requests as rq
from troth.server.ingress.auth import (
    AuthConfigError,
    Authenticator,
    Denied,
    Grant,
    authorize,
    bearer,
    loopback,
    named_ids,
    under,
)

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


def write_public(key: PrivateKey, path: Path) -> str:
    path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return str(path)


def claims(**extra: Any) -> dict[str, Any]:
    return {"exp": int(time.time()) + 86_400, **extra}


KEYS: dict[str, tuple[Any, list[str]]] = {
    "rsa": (
        lambda: rsa.generate_private_key(65537, 2048),
        ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512"],
    ),
    "p256": (lambda: ec.generate_private_key(ec.SECP256R1()), ["ES256"]),
    "p384": (lambda: ec.generate_private_key(ec.SECP384R1()), ["ES384"]),
    "ed25519": (ed25519.Ed25519PrivateKey.generate, ["EdDSA"]),
}


@pytest.mark.parametrize("kind", list(KEYS))
def test_each_key_type_verifies_its_algorithms_and_only_those(kind: str, tmp_path: Path) -> None:
    make, algs = KEYS[kind]
    key = make()
    auth = Authenticator.from_settings(write_public(key, tmp_path / "pub.pem"))
    assert auth is not None and auth.algorithms == algs
    for alg in algs:
        grant = auth.verify(jwt.encode(claims(prefix="a."), key, algorithm=alg))
        assert isinstance(grant, Grant), (alg, grant)
        assert grant.prefix == "a." and not grant.admin
    # Another key of the same type: the signature does not verify.
    other = jwt.encode(claims(), make(), algorithm=algs[0])
    assert auth.verify(other) == Denied(401, "Unauthorized: token signature does not verify")
    # alg none, and HS256 keyed with the public key (the classic confusion): refused.
    assert auth.verify(jwt.encode(claims(), "", algorithm="none")).status == 401  # type: ignore[union-attr]
    forged = hs256(claims(role="admin"), (tmp_path / "pub.pem").read_bytes())
    assert auth.verify(forged) == Denied(
        401, "Unauthorized: token algorithm not accepted for this key"
    )


def hs256(payload: dict[str, Any], secret: bytes) -> str:
    """An HS256 token keyed with ``secret`` (built by hand: PyJWT refuses PEM secrets)."""

    def b64(raw: bytes) -> bytes:
        return base64.urlsafe_b64encode(raw).rstrip(b"=")

    signing = b64(b'{"alg":"HS256","typ":"JWT"}') + b"." + b64(msgspec.json.encode(payload))
    mac = hmac.new(secret, signing, hashlib.sha256).digest()
    return (signing + b"." + b64(mac)).decode()


def test_exp_is_required_and_checked(tmp_path: Path) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    auth = Authenticator.from_settings(write_public(key, tmp_path / "k.pem"))
    assert auth is not None
    no_exp = jwt.encode({"role": "admin"}, key, algorithm="EdDSA")
    assert auth.verify(no_exp) == Denied(401, "Unauthorized: token lacks the 'exp' claim")
    expired = jwt.encode({"exp": int(time.time()) - 3600, "role": "admin"}, key, algorithm="EdDSA")
    assert auth.verify(expired) == Denied(401, "Unauthorized: token expired")
    assert auth.verify("not.a.jwt").status == 401  # type: ignore[union-attr]
    assert auth.verify("garbage").status == 401  # type: ignore[union-attr]


def test_issuer_and_audience_when_configured(tmp_path: Path) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    pub = write_public(key, tmp_path / "k.pem")
    auth = Authenticator.from_settings(pub, "https://idp", "troth")
    assert auth is not None

    def check(**extra: Any) -> Grant | Denied:
        return auth.verify(jwt.encode(claims(**extra), key, algorithm="EdDSA"))

    assert isinstance(check(iss="https://idp", aud="troth"), Grant)
    assert isinstance(check(iss="https://idp", aud=["other", "troth"]), Grant)
    assert check(iss="https://evil", aud="troth") == Denied(
        401, "Unauthorized: token issuer not accepted"
    )
    assert check(iss="https://idp", aud="other") == Denied(
        401, "Unauthorized: token audience not accepted"
    )
    assert check(aud="troth") == Denied(401, "Unauthorized: token lacks the 'iss' claim")
    assert check(iss="https://idp") == Denied(401, "Unauthorized: token lacks the 'aud' claim")
    # Not configured: a token's own aud is not held against it (as the reference).
    open_auth = Authenticator.from_settings(pub)
    assert open_auth is not None
    assert isinstance(
        open_auth.verify(jwt.encode(claims(aud="x", iss="y"), key, algorithm="EdDSA")), Grant
    )


def test_insecure_mode_accepts_unsigned_tokens_but_still_checks_claims() -> None:
    auth = Authenticator.from_settings("none")
    assert auth is not None and auth.insecure
    assert isinstance(auth.verify(jwt.encode(claims(role="admin"), "", algorithm="none")), Grant)
    expired = jwt.encode({"exp": int(time.time()) - 3600}, "", algorithm="none")
    assert auth.verify(expired) == Denied(401, "Unauthorized: token expired")
    assert auth.verify(jwt.encode({}, "", algorithm="none")).status == 401  # type: ignore[union-attr]
    assert auth.authenticate(None, []) == Denied(
        401, "Unauthorized: no token (head.auth or Authorization: Bearer)"
    )


def test_bad_key_files_are_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(AuthConfigError, match="cannot read"):
        Authenticator.from_settings(str(tmp_path / "missing.pem"))
    private = tmp_path / "private.pem"
    private.write_bytes(
        ed25519.Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    with pytest.raises(AuthConfigError, match="private key"):
        Authenticator.from_settings(str(private))
    p521 = write_public(ec.generate_private_key(ec.SECP521R1()), tmp_path / "p521.pem")
    with pytest.raises(AuthConfigError, match="secp521r1 is not supported"):
        Authenticator.from_settings(p521)
    junk = tmp_path / "junk.pem"
    junk.write_text("hello")
    with pytest.raises(AuthConfigError, match="not a PEM public key"):
        Authenticator.from_settings(str(junk))
    assert Authenticator.from_settings("") is None  # auth off


def test_verified_tokens_are_cached_until_they_expire(tmp_path: Path) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    now = [time.time()]
    auth = Authenticator(
        *_load(write_public(key, tmp_path / "k.pem")), cache_size=2, clock=lambda: now[0]
    )
    token = jwt.encode({"exp": int(now[0]) + 100, "prefix": ""}, key, algorithm="EdDSA")
    first = auth.verify(token)
    assert isinstance(first, Grant)
    auth.key = ed25519.Ed25519PrivateKey.generate().public_key()  # a re-verify would fail
    assert auth.verify(token) is first  # from the cache: no signature check
    now[0] += 100 + 61  # past exp and the leeway: dropped, verified again, refused
    assert isinstance(auth.verify(token), Denied)
    assert token not in auth.cache
    # Bounded: the least recently used entry goes.
    auth.key = key.public_key()
    now[0] = time.time()
    tokens = [jwt.encode(claims(prefix=str(i)), key, algorithm="EdDSA") for i in range(3)]
    for t in tokens:
        assert isinstance(auth.verify(t), Grant)
    assert list(auth.cache) == tokens[1:]


def _load(path: str) -> tuple[Any, tuple[str, ...]]:
    from troth.server.ingress.auth import load_key

    return load_key(path)


def test_bearer_header_parsing() -> None:
    assert bearer([(b"authorization", b"Bearer abc.def.ghi")]) == "abc.def.ghi"
    assert bearer([(b"authorization", b"bearer   tok ")]) == "tok"
    assert bearer([(b"authorization", b"Basic dXNlcjpwYXNz")]) is None
    assert bearer([(b"x", b"y")]) is None


def grant(prefix: str | None = "a.", admin: bool = False) -> Grant:
    return Grant(admin=admin, prefix=prefix, groups=None, groups_valid=True, expires=0.0)


def action(kind: str, data: dict[str, Any]) -> rq.Action:
    return rq.Action(kind=kind, data=msgspec.Raw(msgspec.json.encode(data)))


def test_named_ids_cover_nested_actions() -> None:
    create = rq.TaskCreate(
        pid="w", ttl=1, action=action("promise.create", {"id": "x", "timeoutAt": 1})
    )
    assert named_ids(create) == [("action.id", "x")]
    fence = rq.TaskFence(
        id="t", version=1, action=action("promise.settle", {"id": "y", "state": "resolved"})
    )
    assert named_ids(fence) == [("id", "t"), ("action.id", "y")]
    suspend = rq.TaskSuspend(
        id="t",
        version=1,
        actions=[action("promise.register_callback", {"awaited": "p", "awaiter": "t"})],
    )
    assert named_ids(suspend) == [
        ("id", "t"),
        ("actions[].awaited", "p"),
        ("actions[].awaiter", "t"),
    ]
    sched = rq.ScheduleCreate(
        id="s", cron="* * * * *", promise_id="{{.id}}.{{.timestamp}}", promise_timeout=1
    )
    assert named_ids(sched) == [("id", "s"), ("promiseId", "s.")]
    assert named_ids(rq.DebugEmpty()) is None  # unknown to the gate: fail closed


def test_under_includes_the_occurrences_of_own_schedules() -> None:
    assert under("a.x", "a.")
    assert not under("b.x", "a.")
    assert under("~a.nightly/report.17", "a.")
    assert under("~a.nightly/report.17.1", "a.")
    assert not under("~b.nightly/a.17", "a.")
    assert not under("~", "a.") and not under("~/a.", "a.")


def test_authorize_rules() -> None:
    get_b = rq.PromiseGet(id="b.1")
    assert authorize(grant(admin=True, prefix=None), "promise.get", get_b) is get_b
    assert authorize(grant(prefix=""), "promise.get", get_b) is get_b
    assert authorize(grant(prefix=None), "promise.get", rq.PromiseGet(id="a.1")).status == 403  # type: ignore[union-attr]
    assert authorize(grant(prefix=""), "debug.snap", rq.DebugEmpty()).status == 403  # type: ignore[union-attr]
    refused = authorize(grant(), "promise.get", get_b)
    assert isinstance(refused, Denied) and "'b.1'" in refused.message
    # Searches are narrowed, never widened.
    narrowed = authorize(grant(), "promise.search", rq.PromiseSearch())
    assert isinstance(narrowed, rq.PromiseSearch) and narrowed.id_prefix == "a."
    deeper = rq.PromiseSearch(id_prefix="a.x")
    assert authorize(grant(), "promise.search", deeper) is deeper
    occ = authorize(grant(), "task.search", rq.TaskSearch(id_prefix="~"))
    assert isinstance(occ, rq.TaskSearch) and occ.id_prefix == "~a."
    assert authorize(grant(), "schedule.search", rq.ScheduleSearch(id_prefix="b")).status == 403  # type: ignore[union-attr]


def test_grants_from_claims(tmp_path: Path) -> None:
    auth = Authenticator.from_settings("none")
    assert auth is not None

    def g(**extra: Any) -> Grant:
        out = auth.verify(jwt.encode(claims(**extra), "", algorithm="none"))
        assert isinstance(out, Grant)
        return out

    assert g(role="ADMIN").admin  # case-insensitive, as the reference
    assert not g(role="user").admin
    assert g(prefix=7).prefix is None and g(prefix=None).prefix is None
    assert g(groups=["g1"]).groups == frozenset({"g1"})
    assert not g(groups="g1").groups_valid


def test_loopback() -> None:
    assert loopback("127.0.0.1") and loopback("::1") and loopback("localhost")
    assert not loopback("0.0.0.0") and not loopback("10.1.2.3") and not loopback("example.com")


def test_token_command_signs_what_the_server_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["token", "--keygen", str(tmp_path / "keys"), "--type", "ec"]) == 0
    assert (tmp_path / "keys" / "troth-private.pem").stat().st_mode & 0o777 == 0o600
    assert main(["token", "--keygen", str(tmp_path / "keys")]) == 2  # never overwrites
    capsys.readouterr()
    code = main(
        [
            "token",
            "--key",
            str(tmp_path / "keys" / "troth-private.pem"),
            "--prefix",
            "a.",
            "--group",
            "g1",
            "--group",
            "g2",
            "--expires",
            "5m",
            "--audience",
            "troth",
        ]
    )
    assert code == 0
    token = capsys.readouterr().out.strip()
    auth = Authenticator.from_settings(str(tmp_path / "keys" / "troth-public.pem"), "", "troth")
    assert auth is not None
    got = auth.verify(token)
    assert isinstance(got, Grant)
    assert (got.prefix, got.groups, got.admin) == ("a.", frozenset({"g1", "g2"}), False)
    assert 290 < got.expires - time.time() <= 300
    assert main(["token", "--prefix", "x"]) == 2  # no key


def test_start_says_how_clients_are_checked(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from troth.server.config import Settings
    from troth.server.ingress.auth import announce_auth

    logger = logging.getLogger("troth.test")
    caplog.set_level("INFO", "troth.test")
    announce_auth(Settings(host="127.0.0.1"), None, logger)
    assert not caplog.records
    announce_auth(Settings(host="0.0.0.0"), None, logger)
    assert "auth is OFF and troth binds 0.0.0.0" in caplog.text
    caplog.clear()
    announce_auth(Settings(auth_publickey="none"), Authenticator.from_settings("none"), logger)
    assert caplog.records[0].levelname == "WARNING" and "INSECURE" in caplog.text


def test_serve_refuses_an_unusable_key_before_it_binds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nope.pem")
    assert main(["serve", "--store", "memory", "--auth-publickey", missing]) == 2
    assert "auth_publickey: cannot read" in capsys.readouterr().err
    assert main(["serve", "--store", "memory", "--auth-audience", "x"]) == 2  # needs a key
