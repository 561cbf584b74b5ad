"""Access control: who may do what (docs/security.md).

Compatible with the Resonate reference server's JWT scheme (``auth.rs``): the same
settings, the same claims (``role``, ``prefix``), the same key types, the same
unsigned development mode.  Stricter where the reference lets a request through
unchecked: every id a request names must lie under the token's prefix, not only
the one the reference looks at, and a token may be confined to the poll groups it
names (``groups``), so that one tenant's workers cannot read another's messages.

One :class:`Authenticator` serves the whole app; with auth off the app holds None
and pays one ``is not None`` per request.  With auth on, a verified token is kept
in a bounded LRU until its ``exp``, so a worker sending the same token on every
request costs one signature check, not one per request.

Tokens are secrets: nothing here logs one, and refusal messages never quote one.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple

import jwt
import msgspec
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from jwt.types import Options

from troth.protocol import requests as rq
from troth.server.config import ConfigError, Settings

log = logging.getLogger("troth.auth")

#: ``auth_publickey = "none"``: tokens are read but their signatures are not checked.
INSECURE: Final = "none"
#: Seconds of clock skew tolerated on ``exp``/``nbf``/``iat`` (the reference's
#: ``jsonwebtoken`` default, so a token one accepts the other accepts too).
LEEWAY: Final = 60
#: Verified tokens remembered (LRU); each entry is a few hundred bytes.
CACHE_SIZE: Final = 4096

RSA_ALGORITHMS: Final = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
EC_ALGORITHMS: Final = {"secp256r1": "ES256", "secp384r1": "ES384"}

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey


class AuthConfigError(ConfigError):
    """The key file cannot be used; raised at start, so a server never runs open by
    mistake."""


class Denied(NamedTuple):
    """A refusal: 401 (who are you?) or 403 (not allowed), and why."""

    status: int
    message: str


@dataclass(frozen=True, slots=True)
class Grant:
    """What a verified token allows.

    ``prefix`` is None when the token has no usable ``prefix`` claim (absent, null
    or not a string): such a non-admin token may do nothing on ``POST /``.
    ``groups`` is None when the token does not restrict poll groups."""

    admin: bool
    prefix: str | None
    groups: frozenset[str] | None
    groups_valid: bool
    expires: float


def load_key(path: str) -> tuple[PublicKey, tuple[str, ...]]:
    """The public key in the PEM file at ``path`` and the algorithms it verifies.

    The algorithms follow from the key, never from the token: an RSA key accepts
    RS*/PS*, an EC key only the one ES* of its curve, Ed25519 only EdDSA — so a
    token cannot pick a weaker or confused algorithm (``alg: none``, HS256 keyed
    with the public key)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise AuthConfigError(f"auth_publickey: cannot read {path}: {exc.strerror}") from None
    if b"PRIVATE KEY" in data:
        raise AuthConfigError(
            f"auth_publickey: {path} holds a private key; give the server the public key "
            "(troth token --keygen writes both)"
        )
    try:
        if b"BEGIN CERTIFICATE" in data:
            key: Any = x509.load_pem_x509_certificate(data).public_key()
        else:
            key = load_pem_public_key(data)
    except ValueError as exc:
        raise AuthConfigError(f"auth_publickey: {path} is not a PEM public key: {exc}") from None
    if isinstance(key, rsa.RSAPublicKey):
        return key, RSA_ALGORITHMS
    if isinstance(key, ec.EllipticCurvePublicKey):
        alg = EC_ALGORITHMS.get(key.curve.name)
        if alg is None:
            raise AuthConfigError(
                f"auth_publickey: EC curve {key.curve.name} is not supported (P-256, P-384)"
            )
        return key, (alg,)
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key, ("EdDSA",)
    raise AuthConfigError(
        f"auth_publickey: {type(key).__name__} keys are not supported "
        "(RSA, EC P-256/P-384, Ed25519)"
    )


class Authenticator:
    """Verifies tokens and decides what each request may do."""

    def __init__(
        self,
        key: PublicKey | None,
        algorithms: tuple[str, ...],
        *,
        issuer: str | None = None,
        audience: str | None = None,
        cache_size: int = CACHE_SIZE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.key = key
        self.algorithms = list(algorithms)
        self.issuer = issuer
        self.audience = audience
        self.cache_size = cache_size
        self.clock = clock
        self.cache: OrderedDict[str, Grant] = OrderedDict()
        required = ["exp"]
        if issuer is not None:
            required.append("iss")
        if audience is not None:
            required.append("aud")
        # Every check named explicitly: PyJWT turns the claim checks off by default
        # when the signature is not verified (the insecure mode), and troth wants
        # exp/iss/aud checked in both modes, as the reference does.
        self.options: Options = {
            "verify_signature": key is not None,
            "verify_exp": True,
            "verify_nbf": True,
            "verify_iat": True,
            "verify_iss": issuer is not None,
            "verify_aud": audience is not None,
            "require": required,
        }

    @classmethod
    def from_settings(
        cls, publickey: str, issuer: str = "", audience: str = ""
    ) -> Authenticator | None:
        """None when auth is off (``publickey`` empty); raises :class:`AuthConfigError`
        when the key cannot be used."""
        if not publickey:
            return None
        if publickey == INSECURE:
            return cls(None, (), issuer=issuer or None, audience=audience or None)
        key, algorithms = load_key(publickey)
        return cls(key, algorithms, issuer=issuer or None, audience=audience or None)

    @property
    def insecure(self) -> bool:
        return self.key is None

    # -- authentication -------------------------------------------------------------

    def authenticate(
        self, head_auth: object, headers: Iterable[tuple[bytes, bytes]]
    ) -> Grant | Denied:
        """The grant of the request's token: ``head.auth`` if the envelope has one,
        else ``Authorization: Bearer`` (the SDKs send both, with the same token)."""
        if head_auth is not None and not isinstance(head_auth, str):
            return Denied(401, "Unauthorized: head.auth must be a string (a JWT)")
        token = head_auth or bearer(headers)
        if not token:
            return Denied(401, "Unauthorized: no token (head.auth or Authorization: Bearer)")
        return self.verify(token)

    def verify(self, token: str) -> Grant | Denied:
        """Verify ``token`` (or find it verified), refusing with 401 and the reason."""
        now = self.clock()
        grant = self.cache.get(token)
        if grant is not None:
            if now < grant.expires + LEEWAY:
                self.cache.move_to_end(token)
                return grant
            del self.cache[token]
        try:
            claims = jwt.decode(
                token,
                self.key,  # type: ignore[arg-type]  # None only when not verifying
                algorithms=self.algorithms or None,
                issuer=self.issuer,
                audience=self.audience,
                leeway=LEEWAY,
                options=self.options,
            )
        except jwt.ExpiredSignatureError:
            return Denied(401, "Unauthorized: token expired")
        except jwt.MissingRequiredClaimError as exc:
            return Denied(401, f"Unauthorized: token lacks the {exc.claim!r} claim")
        except jwt.InvalidAlgorithmError:
            return Denied(401, "Unauthorized: token algorithm not accepted for this key")
        except jwt.InvalidSignatureError:
            return Denied(401, "Unauthorized: token signature does not verify")
        except jwt.InvalidIssuerError:
            return Denied(401, "Unauthorized: token issuer not accepted")
        except jwt.InvalidAudienceError:
            return Denied(401, "Unauthorized: token audience not accepted")
        except jwt.InvalidTokenError as exc:
            # PyJWT's messages describe the token's shape, never its contents.
            return Denied(401, f"Unauthorized: invalid token ({exc})")
        grant = grant_of(claims)
        self.cache[token] = grant
        if len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return grant

    # -- authorization --------------------------------------------------------------

    def may_poll(self, headers: Iterable[tuple[bytes, bytes]], group: str) -> Denied | None:
        """``GET /poll/{group}/{id}``: the Bearer token must verify and, when it names
        ``groups``, include this group."""
        grant = self.authenticate(None, headers)
        if isinstance(grant, Denied):
            return grant
        if grant.admin or (grant.groups is None and grant.groups_valid):
            return None
        if not grant.groups_valid:
            return Denied(403, "Forbidden: the token's groups claim is not a list of strings")
        assert grant.groups is not None
        if group not in grant.groups:
            return Denied(403, f"Forbidden: the token may not poll group {group[:200]!r}")
        return None

    def require_admin(self, headers: Iterable[tuple[bytes, bytes]]) -> Denied | None:
        """The operator surfaces (``/metrics``, ``/ops/…``): an admin Bearer token."""
        grant = self.authenticate(None, headers)
        if isinstance(grant, Denied):
            return grant
        if not grant.admin:
            return Denied(403, "Forbidden: this path needs an admin token")
        return None


def announce_auth(settings: Settings, auth: Authenticator | None, logger: logging.Logger) -> None:
    """Say at start how clients are checked, loudly when they are not."""
    if auth is None:
        if not loopback(settings.host):
            logger.warning(
                "auth is OFF and troth binds %s: anyone who can reach port %d can read, "
                "settle and cancel every promise and poll every group's messages; set "
                "auth_publickey (docs/security.md)",
                settings.host,
                settings.port,
            )
        return
    if auth.insecure:
        logger.warning(
            "auth_publickey = none: INSECURE DEVELOPMENT MODE — token signatures are NOT "
            "checked, anyone can forge any token, including an admin one; never use this "
            "where others can reach the server"
        )
        return
    logger.info(
        "auth on: tokens verified with %s from %s%s%s",
        "/".join(auth.algorithms),
        settings.auth_publickey,
        f", iss={settings.auth_issuer}" if settings.auth_issuer else "",
        f", aud={settings.auth_audience}" if settings.auth_audience else "",
    )


def loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: may resolve to anything


def authorize(grant: Grant, kind: str, req: rq.Req) -> rq.Req | Denied:
    """``req`` as ``grant`` lets it run (a search narrowed to the token's prefix),
    or 403."""
    if grant.admin:
        return req
    if kind.startswith("debug."):
        return Denied(403, "Forbidden: debug operations need an admin token")
    prefix = grant.prefix
    if prefix is None:
        return Denied(
            403, "Forbidden: the token is not an admin token and has no string prefix claim"
        )
    if not prefix:
        return req  # "" is every id
    if isinstance(req, SEARCHES):
        return narrow_search(req, prefix)
    named = named_ids(req)
    if named is None:
        return Denied(403, f"Forbidden: {kind} needs an admin token")
    for field, id in named:
        if not under(id, prefix):
            return Denied(
                403,
                f"Forbidden: {field} {id[:200]!r} is not under the token's prefix {prefix!r}",
            )
    return req


def bearer(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The token of an ``Authorization: Bearer …`` header (ASGI names are lowercase)."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


def grant_of(claims: Mapping[str, Any]) -> Grant:
    """What the claims allow: ``role`` ``admin`` (any case, as the reference) is
    everything; ``prefix`` a string; ``groups`` a list of strings or absent."""
    role = claims.get("role")
    prefix = claims.get("prefix")
    groups = claims.get("groups")
    valid = groups is None or (isinstance(groups, list) and all(isinstance(g, str) for g in groups))
    return Grant(
        admin=isinstance(role, str) and role.lower() == "admin",
        prefix=prefix if isinstance(prefix, str) else None,
        groups=frozenset(groups) if valid and groups is not None else None,
        groups_valid=valid,
        expires=float(claims["exp"]),
    )


def under(id: str, prefix: str) -> bool:
    """Whether ``id`` belongs to the holder of ``prefix``.

    Besides the ids that start with it, a schedule occurrence ``~{schedule}/…`` (and
    the SDK's children of it, ``~{schedule}/….1``) belongs to whoever owns the
    schedule: clients cannot create ``~`` ids (docs/protocol.md), so such an id
    exists only because a schedule under the prefix made it."""
    if id.startswith(prefix):
        return True
    if id.startswith("~"):
        slash = id.find("/")
        return slash > 1 and id[1:slash].startswith(prefix)
    return False


SEARCHES = (rq.PromiseSearch, rq.TaskSearch, rq.ScheduleSearch)
Search = rq.PromiseSearch | rq.TaskSearch | rq.ScheduleSearch


def narrow_search(req: Search, prefix: str) -> Search | Denied:
    """A search by a prefix token sees only ids under its prefix: its ``idPrefix``
    is narrowed to the token's (or to ``~`` + prefix, the occurrences of the
    token's schedules, when it asked for those); one outside the prefix is 403."""
    asked = req.id_prefix or ""
    occurrences = "~" + prefix
    if asked.startswith(prefix) or asked.startswith(occurrences):
        return req
    if prefix.startswith(asked):
        return msgspec.structs.replace(req, id_prefix=prefix)
    if occurrences.startswith(asked):
        return msgspec.structs.replace(req, id_prefix=occurrences)
    return Denied(
        403, f"Forbidden: idPrefix {asked[:200]!r} is not under the token's prefix {prefix!r}"
    )


def named_ids(req: rq.Req) -> list[tuple[str, str]] | None:
    """Every id ``req`` names, as (field, id), nested actions included; None for a
    request kind this function does not know (refused: fail closed).

    A ``pid`` is a worker's name, not a resource, and a listener's ``address`` is a
    destination: neither is checked.  ``task.fulfill``'s inner settle id is not
    consulted by the server (SPEC.md §10.11), so it is not checked either."""
    if isinstance(req, rq.PromiseRegisterCallback):
        return [("awaited", req.awaited), ("awaiter", req.awaiter)]
    if isinstance(req, rq.PromiseRegisterListener):
        return [("awaited", req.awaited)]
    if isinstance(req, rq.TaskHeartbeat):
        return [("tasks[].id", t.id) for t in req.tasks]
    if isinstance(req, rq.TaskCreate):
        return list(_inner(req.action, "action"))
    if isinstance(req, rq.TaskFence):
        return [("id", req.id), *_inner(req.action, "action")]
    if isinstance(req, rq.TaskSuspend):
        named = [("id", req.id)]
        for action in req.actions:
            named.extend(_inner(action, "actions[]"))
        return named
    if isinstance(req, rq.ScheduleCreate):
        # The template with {{.id}} filled in, up to its first other placeholder,
        # decides how every occurrence's expanded id begins.
        head = req.promise_id.replace("{{.id}}", req.id).partition("{{")[0]
        return [("id", req.id), ("promiseId", head)]
    if isinstance(req, _BY_ID):
        return [("id", req.id)]
    return None


_BY_ID = (
    rq.PromiseGet,
    rq.PromiseCreate,
    rq.PromiseSettle,
    rq.TaskGet,
    rq.TaskAcquire,
    rq.TaskFulfill,
    rq.TaskRelease,
    rq.TaskHalt,
    rq.TaskContinue,
    rq.ScheduleGet,
    rq.ScheduleDelete,
)


def _inner(action: rq.Action, where: str) -> Iterator[tuple[str, str]]:
    """The ids of a nested action.  One that does not decode names nothing: the
    machine refuses it (400) before reading or writing anything."""
    try:
        inner = rq.decode_data(action.kind, action.data)
    except rq.BadRequest:
        return
    named = named_ids(inner)
    if named is None:
        # A kind no action may have: refused by the machine; name it anyway so a
        # prefix token cannot slip an unchecked id past this gate.
        named = [("id", v) for v in [getattr(inner, "id", None)] if isinstance(v, str)]
    for field, id in named:
        yield f"{where}.{field}", id
