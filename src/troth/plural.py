"""Counts said the way people say them: ``1 promise``, ``2 promises``, ``0 promises``.

Every count that troth prints next to a noun (the client commands, explain's
reasons, the bench's summaries) goes through :func:`counted`, so that none of them
reads "1 promises"."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None, *, at_least: bool = False) -> str:
    """``n`` and ``noun``, the noun in the plural unless ``n`` is exactly one.

    ``plural`` is given when adding an ``s`` is wrong (``counted(n, "child",
    "children")``); ``at_least`` writes ``n+`` for a count that stopped early, which
    always takes the plural ("1+ sends": one and possibly more)."""
    word = noun if n == 1 and not at_least else plural or f"{noun}s"
    return f"{n:,}{'+' if at_least else ''} {word}"
