"""Named SQL queries, one ``.sql`` file per dialect, loaded by one loader.

A query starts at a header line ``-- name: <name>`` and runs to the next header;
other comment lines are documentation and are dropped, as is surrounding white
space.  Both dialects name their queries alike, so the code that uses them reads
the same on either.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from types import MappingProxyType
from typing import Final

_HEADER: Final = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$")


def parse_queries(text: str) -> dict[str, str]:
    """The named queries of one file's text (a name given twice is an error)."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        header = _HEADER.match(line.strip())
        if header is not None:
            name = header.group(1)
            if name in found:
                raise ValueError(f"query {name!r} is defined twice")
            current = found[name] = []
        elif current is not None and not line.lstrip().startswith("--"):
            current.append(line.strip())
    return {name: " ".join(part for part in lines if part) for name, lines in found.items()}


@functools.cache
def load_queries(package: str, file: str = "queries.sql") -> MappingProxyType[str, str]:
    """The named queries shipped in ``package`` (e.g. ``troth.store.sqlite``)."""
    text = resources.files(package).joinpath(file).read_text(encoding="utf-8")
    return MappingProxyType(parse_queries(text))
