"""One value of a server's ``/metrics``, as the tests read it."""

from __future__ import annotations

import re

import httpx


def metric(url: str, line: str) -> float:
    """The value of the series ``line`` (a name, with its labels if it has any) that
    the server at ``url`` exposes now; fails if it exposes no such series."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    match = re.search(rf"^{re.escape(line)} (\S+)$", text, re.M)
    assert match is not None, (line, text)
    return float(match[1])
