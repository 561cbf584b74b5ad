"""Addresses as they may appear in a log line: without the secrets a URL can carry.

A delivery address or a NATS URL is the operator's or a worker's text, and may hold
credentials (``nats://user:password@host``, ``https://user:key@hooks.example.com``)
or a key in its query (``…/hook?token=…``).  A log line shows where, never how to
get in: the user-info is replaced by ``***`` and every query value by ``***``.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

HIDDEN = "***"


def url(text: str) -> str:
    """``text`` with the user-info and query values of each comma-separated URL
    hidden; text that is not a URL is returned as it is."""
    return ",".join(_one(part) for part in text.split(","))


def _one(text: str) -> str:
    try:
        parts = urlsplit(text)
    except ValueError:
        return HIDDEN if "@" in text or "?" in text else text
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{HIDDEN}@{netloc.rpartition('@')[2]}"
    query = parts.query
    if query:
        query = "&".join(f"{pair.partition('=')[0]}={HIDDEN}" for pair in query.split("&"))
    if netloc == parts.netloc and query == parts.query:
        return text
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
