"""Delivery addresses (REFERENCE-SERVER.md §3.1, SDK-CLIENTS.md §2.5)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PollAddress:
    """``poll://uni@group/id`` (exactly that id), ``poll://any@group[/id]`` (prefer id)."""

    cast: str  # "uni" | "any"
    group: str
    id: str | None


def parse_poll(address: str) -> PollAddress | None:
    """Parse a ``poll://`` address; groups are lower-cased as the SDKs' parsers do."""
    if not address.startswith("poll://"):
        return None
    rest = address[len("poll://") :]
    cast, at, where = rest.partition("@")
    if not at or cast not in ("uni", "any") or not where:
        return None
    group, _, id = where.partition("/")
    if not group or (cast == "uni" and not id):
        return None
    return PollAddress(cast, group.lower(), id or None)
