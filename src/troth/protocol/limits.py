"""Input limits an operator sets: JSON nesting depth, id and tag lengths.

Both checks are built so that the ordinary request pays next to nothing:

* **Depth.** msgspec decodes recursively and raises ``RecursionError`` a thousand
  levels down (also while skipping an unknown field), so the depth is checked before
  any decode.  The common case is one ``bytes.count`` per bracket kind: a body with
  no more than ``max_depth`` opening brackets cannot nest deeper than that (a
  request is a few hundred bytes with a handful of brackets).  Only a body with
  more brackets is scanned exactly, at C speed: strings are cut out, the rest is
  reduced to brackets, and each pass removes the innermost pairs (one level), so
  at most ``max_depth`` passes decide.
* **Lengths.** A body no longer than ``max_id`` bytes cannot hold a longer string,
  so most requests skip the check; otherwise every id the request names (nested
  actions included) and every tag key and value is measured in UTF-8 bytes, which
  is what the stores index (PostgreSQL refuses a b-tree entry past ~2.7 kB).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from troth.protocol import requests as rq

_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS: Final = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS: Final = bytes(c for c in range(256) if c not in b"[]{}")

#: The fields of a request that name something the store keeps under that name.
_ID_FIELDS: Final = ("id", "awaited", "awaiter", "pid", "address", "promise_id", "cron")
_TAG_FIELDS: Final = ("tags", "promise_tags")


def depth_exceeds(body: bytes, limit: int) -> bool:
    """Whether ``body``'s JSON nests deeper than ``limit`` containers.

    Exact for well-formed JSON; for malformed JSON it may answer either way, but it
    never lets through a body that would nest deeper than ``2 * limit``."""
    if body.count(b"{") + body.count(b"[") <= limit:
        return False
    shape = _STRING.sub(b"", body).translate(_BRACKETS, _NOT_BRACKETS)
    for _ in range(limit):
        inner = shape.replace(b"()", b"")
        if not inner:
            return False
        if len(inner) == len(shape):
            # Unbalanced (malformed): what is left is ")))(((": the openers never close.
            return inner.count(b"(") > limit
        shape = inner
    return True


@dataclass(frozen=True)
class Limits:
    """What a request may carry; see ``Settings.max_depth`` and friends."""

    max_depth: int = 64
    max_id: int = 1024
    max_tag: int = 65536

    def check_depth(self, body: bytes) -> str | None:
        if depth_exceeds(body, self.max_depth):
            return f"Invalid request envelope: JSON nests deeper than {self.max_depth} levels"
        return None

    def check_request(self, req: rq.Req, body_size: int) -> str | None:
        """The refusal message when ``req`` names an id or tag that is too long."""
        if body_size <= self.max_id:
            return None
        return self._check(req, "")

    def _check(self, req: rq.Req, where: str) -> str | None:
        for name in _ID_FIELDS:
            value = getattr(req, name, None)
            if isinstance(value, str) and too_long(value, self.max_id):
                return f"Invalid request: {_camel(name)} longer than {self.max_id} bytes{where}"
        for name in _TAG_FIELDS:
            tags = getattr(req, name, None)
            if tags:
                for key, value in tags.items():
                    if too_long(key, self.max_id):
                        return (
                            f"Invalid request: tag key longer than {self.max_id} bytes"
                            f" in {_camel(name)}{where}"
                        )
                    if too_long(value, self.max_tag):
                        return (
                            f"Invalid request: tag {key[:64]!r} longer than {self.max_tag}"
                            f" bytes in {_camel(name)}{where}"
                        )
        if isinstance(req, rq.TaskHeartbeat):
            for ref in req.tasks:
                if too_long(ref.id, self.max_id):
                    return f"Invalid request: tasks[].id longer than {self.max_id} bytes"
        actions: list[rq.Action] = []
        if isinstance(req, rq.TaskCreate | rq.TaskFence | rq.TaskFulfill):
            actions = [req.action]
        elif isinstance(req, rq.TaskSuspend):
            actions = list(req.actions)
        for action in actions:
            try:
                inner = rq.decode_data(action.kind, action.data)
            except rq.BadRequest:
                continue  # the machine refuses it with its own message, in guard order
            refused = self._check(inner, " (in action)")
            if refused is not None:
                return refused
        return None


def too_long(text: str, limit: int) -> bool:
    """UTF-8 length > ``limit``, encoding only when the character count cannot say."""
    n = len(text)
    if n * 4 <= limit:
        return False
    if n > limit:
        return True
    return len(text.encode("utf-8", "surrogatepass")) > limit


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
