"""Durations as people type them: ``1h``, ``30s``, ``1m30s``, ``100ms``, ``2d``."""

from __future__ import annotations

import re
from typing import Final

_UNITS: Final = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART: Final = re.compile(r"(\d+)([a-z]*)")


def parse_duration(text: str) -> int:
    """Milliseconds of ``text``; ``ValueError`` with a message saying what is wrong.

    Parts add up (``1h30m``); each needs a unit (ms, s, m, h, d); a lone ``0`` is
    zero.
    """
    if text == "0":
        return 0
    total, pos = 0, 0
    while pos < len(text):
        part = _PART.match(text, pos)
        if part is None:
            raise ValueError(f"invalid duration {text!r}: expected a number at {text[pos:]!r}")
        number, unit = part.groups()
        if not unit:
            raise ValueError(f"invalid duration {text!r}: {number} needs a unit (ms, s, m, h, d)")
        if unit not in _UNITS:
            raise ValueError(f"invalid duration {text!r}: unknown unit {unit!r}")
        total += int(number) * _UNITS[unit]
        pos = part.end()
    if not text:
        raise ValueError("invalid duration '': expected something like 30s or 1h")
    return total
