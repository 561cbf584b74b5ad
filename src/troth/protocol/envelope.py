"""The request/response envelope of ``POST /`` (SDK-CLIENTS.md §2.2).

Both SDKs reject a response whose ``kind`` or ``corrId`` differs from the request's,
so even a refused envelope echoes whatever of them can be dug out of the body.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from troth import PROTOCOL_VERSION
from troth.protocol.limits import shape_refusal


class Head(msgspec.Struct, frozen=True):
    corrId: str
    version: str
    debug_time: int | None = msgspec.field(default=None, name="resonate:debug_time")
    #: The client's token (server/ingress/auth.py), never logged.  Any type decodes, so a
    #: server without auth ignores whatever a client puts here, as before.
    auth: Any = None
    #: W3C trace context of the caller (an extension, docs/protocol.md): continued
    #: by the request's span with tracing on, ignored with it off.  Any type
    #: decodes, so that a malformed one never refuses a request.
    traceparent: Any = None
    tracestate: Any = None


class Envelope(msgspec.Struct, frozen=True):
    kind: str
    head: Head
    data: msgspec.Raw


class EnvelopeError(Exception):
    """A 400 about the envelope itself, with what could be recovered for the echo."""

    def __init__(self, message: str, kind: str, corr_id: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.corr_id = corr_id


_envelope = msgspec.json.Decoder(Envelope)
_loose = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


#: A top-level-looking ``"kind": "…"`` / ``"corrId": "…"`` for bodies too deep to
#: decode at all: a best-effort echo, found in one linear scan.
_KIND: Final = re.compile(rb'"kind"\s*:\s*("(?:[^"\\]|\\.){0,512}")')
_CORR: Final = re.compile(rb'"corrId"\s*:\s*("(?:[^"\\]|\\.){0,512}")')


def decode_envelope(body: bytes, max_depth: int = 64) -> Envelope:
    """Decode and check an envelope; raises :class:`EnvelopeError` (400).

    A body that nests deeper than ``max_depth``, or holds more than
    ``limits.MAX_CONTAINERS`` objects and arrays, is refused before any decode
    (msgspec recurses, and would raise ``RecursionError`` a thousand levels down)."""
    refused = shape_refusal(body, max_depth)
    if refused is not None:
        kind, corr = scan_echo(body)
        raise EnvelopeError(f"Invalid request envelope: {refused}", kind, corr)
    try:
        env = _envelope.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        kind, corr = salvage(body)
        raise EnvelopeError(f"Invalid request envelope: {exc}", kind, corr) from None
    except RecursionError:  # only past a max_depth near the interpreter's limit
        kind, corr = scan_echo(body)
        raise EnvelopeError("Invalid request envelope: JSON nests too deep", kind, corr) from None
    if not env.kind:
        raise EnvelopeError("Invalid request envelope: kind must not be empty", "", env.head.corrId)
    if env.head.version != PROTOCOL_VERSION:
        raise EnvelopeError(
            f"Unsupported protocol version {env.head.version!r}: this server speaks "
            f"{PROTOCOL_VERSION}",
            env.kind,
            env.head.corrId,
        )
    raw = bytes(env.data).lstrip()
    if not raw.startswith(b"{"):
        raise EnvelopeError(
            "Invalid request envelope: data must be an object", env.kind, env.head.corrId
        )
    return env


def salvage(body: bytes) -> tuple[str, str]:
    """Best-effort ``kind`` and ``corrId`` of an envelope that did not decode."""
    try:
        obj: Any = _loose.decode(body)
    except msgspec.DecodeError:
        return "unknown", "0"
    except RecursionError:
        return scan_echo(body)
    if not isinstance(obj, dict):
        return "unknown", "0"
    kind = obj.get("kind")
    head = obj.get("head")
    corr = head.get("corrId") if isinstance(head, dict) else None
    return (kind if isinstance(kind, str) else "unknown", corr if isinstance(corr, str) else "0")


def scan_echo(body: bytes) -> tuple[str, str]:
    """``kind`` and ``corrId`` of a body that cannot be decoded at all: the first
    string-valued ``"kind"`` and ``"corrId"`` members, if any."""
    return _scan(_KIND, body, "unknown"), _scan(_CORR, body, "0")


def _scan(pattern: re.Pattern[bytes], body: bytes, default: str) -> str:
    match = pattern.search(body)
    if match is None:
        return default
    try:
        text = _string.decode(match.group(1))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return default
    return text


_string = msgspec.json.Decoder(str)


def encode_response(kind: str, corr_id: str, status: int, data: object) -> bytes:
    """One encode per response: the envelope with HTTP status = ``head.status``."""
    return _encoder.encode(
        {
            "kind": kind,
            "head": {"corrId": corr_id, "status": status, "version": PROTOCOL_VERSION},
            "data": data,
        }
    )
