"""Delivery addresses: the one grammar troth reads them with.

Two readings of one address, kept side by side so that they cannot drift apart:

* :func:`address_valid` is the specification's ``addressValid`` (SPEC.md §2.3), the
  loose check a ``register_listener`` passes: an ``http(s)://`` URL, or ``poll://``
  with an ``@``.  It decides what a request may store, so it stays the
  specification's, with one extension: ``nats://`` + a literal NATS subject, the
  addresses the SDKs' NATS connector (``resonate-nats``) hands out
  (docs/protocol.md).
* :func:`nats_subject` reads a ``nats://`` address: the subject, exactly as written
  (subjects are case-sensitive; the connector's subscriptions are too).
* :func:`parse_poll` is the strict reading delivery needs (REFERENCE-SERVER.md §3.1,
  SDK-CLIENTS.md §2.5): ``poll://uni@group/id`` (exactly that id) or
  ``poll://any@group[/id]`` (prefer that id); anything else cannot be delivered.

:func:`scheme_of` names the transport an address goes to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

POLL: Final = "poll"
HTTP: Final = "http"
HTTPS: Final = "https"
NATS: Final = "nats"

_POLL_PREFIX: Final = "poll://"
_NATS_PREFIX: Final = "nats://"


@dataclass(frozen=True)
class PollAddress:
    """``poll://uni@group/id`` (exactly that id), ``poll://any@group[/id]`` (prefer id)."""

    cast: str  # "uni" | "any"
    group: str
    id: str | None


def scheme_of(address: str) -> str:
    """The scheme before ``://`` exactly as written (schemes are matched case-sensitively,
    as the SDKs write them), or ``""`` when there is none."""
    scheme, sep, _ = address.partition("://")
    return scheme if sep else ""


def address_valid(address: str) -> bool:
    """Deliverable listener addresses (§2.3 ``addressValid``, plus ``nats://``)."""
    scheme = scheme_of(address)
    if scheme == NATS:
        return nats_subject(address) is not None
    return scheme in (HTTP, HTTPS) or (scheme == POLL and "@" in address)


def valid_subject(subject: str) -> bool:
    """A literal NATS subject one can publish to: dot-separated non-empty tokens,
    no wildcard token (``*``, ``>``), no whitespace."""
    return all(
        token and token not in ("*", ">") and not any(c.isspace() for c in token)
        for token in subject.split(".")
    )


def nats_subject(address: str) -> str | None:
    """The subject of ``nats://{subject}``, exactly as written; None if it is not one."""
    if not address.startswith(_NATS_PREFIX):
        return None
    subject = address[len(_NATS_PREFIX) :]
    return subject if valid_subject(subject) else None


def parse_poll(address: str) -> PollAddress | None:
    """Parse a ``poll://`` address; groups are lower-cased as the SDKs' parsers do."""
    if not address.startswith(_POLL_PREFIX):
        return None
    rest = address[len(_POLL_PREFIX) :]
    cast, at, where = rest.partition("@")
    if not at or cast not in ("uni", "any") or not where:
        return None
    group, _, id = where.partition("/")
    if not group or (cast == "uni" and not id):
        return None
    return PollAddress(cast, group.lower(), id or None)
