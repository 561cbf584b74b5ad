"""Instants and durations in words, the same for the CLI and the operator API:
``in 4m12s``, ``3s ago``, ``2026-12-01 14:05:00 UTC (in 2m)``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

#: Instants this far out are "never" in practice (the SDKs' "no timeout").
FAR_MS: Final = 100 * 365 * 86_400_000


def relative(ms: int, now_ms: int) -> str:
    """``in 4m12s`` / ``3s ago`` / ``now``."""
    delta = ms - now_ms
    if abs(delta) < 1000:
        return "now"
    text = span(abs(delta))
    return f"in {text}" if delta > 0 else f"{text} ago"


def span(ms: int) -> str:
    """A duration, its two largest units: ``2d3h``, ``4m12s``, ``850ms``."""
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms // 1000
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts[:2])


def instant(ms: int | None, now_ms: int) -> str:
    """Absolute UTC time and how far from now; ``-`` for none, ``never`` for far out."""
    if ms is None:
        return "-"
    if ms - now_ms > FAR_MS:
        return "never"
    try:
        when = datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return f"{when} ({relative(ms, now_ms)})"
