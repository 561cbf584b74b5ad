"""``troth token``: sign a JWT for development and scripts; ``--keygen`` makes a key pair.

Production tokens come from whatever issues identities (an IdP, a secrets manager);
this command is for a laptop, a CI job or a script that owns the private key.  The
token goes to stdout and nowhere else, so ``RESONATE_TOKEN=$(troth token …)`` works
and no log keeps it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from troth.cli.help import Formatter
from troth.durations import parse_duration

TOKEN_EPILOG = """\
examples:
  troth token --keygen keys
  troth token --key keys/troth-private.pem --role admin
  troth token --key keys/troth-private.pem --prefix order- --group workers
  export RESONATE_TOKEN=$(troth token --key keys/troth-private.pem --expires 7d)"""

PRIVATE = "troth-private.pem"
PUBLIC = "troth-public.pem"


def add_token_command(sub: Any) -> None:
    p = sub.add_parser(
        "token",
        help="make a key pair, or sign a token for a server with auth on",
        description="Sign a token (a JWT) for a troth server with auth on, for development"
        " and scripts: the token goes to stdout and nowhere else. With --keygen, make the"
        " key pair instead: the server is given the public key (auth_publickey), whoever"
        " signs tokens keeps the private one.",
        epilog=TOKEN_EPILOG,
        formatter_class=Formatter,
    )
    p.add_argument("--key", help="private key PEM that signs, or 'none' for an unsigned token")
    p.add_argument("--prefix", help='ids the token may name ("" = all)')
    p.add_argument("--role", help="admin: a token that may do everything")
    p.add_argument(
        "--group",
        dest="groups",
        action="append",
        help="a poll group the token may open (repeat; default: every group)",
    )
    p.add_argument("--expires", default="1h", help="lifetime, e.g. 30m, 1h, 7d (default 1h)")
    p.add_argument("--issuer", help="iss claim")
    p.add_argument("--audience", help="aud claim")
    p.add_argument("--subject", help="sub claim (who holds it; shows in nothing troth logs)")
    p.add_argument("--alg", help="signing algorithm (default: from the key)")
    p.add_argument(
        "--keygen",
        metavar="DIR",
        help=f"write a new key pair to DIR/{PRIVATE} (mode 600) and DIR/{PUBLIC}",
    )
    p.add_argument(
        "--type",
        choices=["ed25519", "ec", "rsa"],
        default="ed25519",
        help="key type of --keygen (ed25519)",
    )


def run_token(args: argparse.Namespace) -> int:
    try:
        if args.keygen:
            private, public = keygen(Path(args.keygen), args.type)
            print(f"wrote {private} (keep it secret) and {public} (auth_publickey)")
            return 0
        if not args.key:
            raise ValueError("--key PATH (or --key none) is required, or --keygen DIR")
        lifetime = parse_duration(args.expires) / 1000
        if lifetime <= 0:
            raise ValueError("--expires must be longer than 0")
        claims: dict[str, Any] = {"exp": int(time.time() + lifetime), "iat": int(time.time())}
        for name in ("prefix", "role", "groups", "issuer", "audience", "subject"):
            value = getattr(args, name)
            if value is not None:
                claims[{"issuer": "iss", "audience": "aud", "subject": "sub"}.get(name, name)] = (
                    value
                )
        print(sign(claims, args.key, args.alg))
        return 0
    except (OSError, ValueError, TypeError, jwt.PyJWTError) as exc:
        print(f"troth token: {exc}", file=sys.stderr)
        return 2


def sign(claims: dict[str, Any], key_path: str, alg: str | None = None) -> str:
    """``claims`` signed with the private key at ``key_path`` (``none``: unsigned)."""
    if key_path == "none":
        return jwt.encode(claims, "", algorithm="none")
    key = serialization.load_pem_private_key(Path(key_path).read_bytes(), password=None)
    return jwt.encode(claims, key, algorithm=alg or default_alg(key))  # type: ignore[arg-type]


def default_alg(key: object) -> str:
    if isinstance(key, rsa.RSAPrivateKey):
        return "RS256"
    if isinstance(key, ec.EllipticCurvePrivateKey):
        if key.curve.name == "secp256r1":
            return "ES256"
        if key.curve.name == "secp384r1":
            return "ES384"
        raise ValueError(f"EC curve {key.curve.name} is not supported (P-256, P-384)")
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "EdDSA"
    raise ValueError(f"{type(key).__name__} keys are not supported (RSA, EC, Ed25519)")


def keygen(directory: Path, kind: str) -> tuple[Path, Path]:
    """A fresh key pair in ``directory``; refuses to overwrite a private key."""
    directory.mkdir(parents=True, exist_ok=True)
    private_path, public_path = directory / PRIVATE, directory / PUBLIC
    if private_path.exists():
        raise ValueError(f"{private_path} exists; not overwriting a key")
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
    if kind == "rsa":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif kind == "ec":
        key = ec.generate_private_key(ec.SECP256R1())
    else:
        key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public_path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private_path, public_path
