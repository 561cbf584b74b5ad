"""Input limits an operator sets: JSON nesting depth, id and tag lengths.

Both checks are built so that the ordinary request pays next to nothing:

* **Depth.** msgspec decodes recursively and raises ``RecursionError`` a thousand
  levels down (also while skipping an unknown field), so the depth is checked before
  the typed decode.  The common case is one ``bytes.count`` per bracket kind: a body
  with no more than ``max_depth`` opening brackets cannot nest deeper than that (a
  request is a few hundred bytes with a handful of brackets).  A body with more is
  decoded generically (C) and its containers walked level by level, at most
  ``max_depth`` levels; a body with more than ``MAX_CONTAINERS`` brackets is refused
  outright, which bounds that walk.
* **Lengths.** A body no longer than ``max_id`` bytes cannot hold a longer string,
  so most requests skip the check; otherwise every id the request names (nested
  actions included) and every tag key and value is measured in UTF-8 bytes, which
  is what the stores index (PostgreSQL refuses a b-tree entry past ~2.7 kB).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import msgspec

from troth.protocol import requests as rq

#: The fields of a request that name something the store keeps under that name.
_ID_FIELDS: Final = ("id", "awaited", "awaiter", "pid", "address", "promise_id", "cron")
_TAG_FIELDS: Final = ("tags", "promise_tags")


#: Most ``{`` and ``[`` one request may hold (counted in the raw body, strings
#: included: cheap, and no real request comes near — SDK payloads are base64).  It
#: bounds the work of the exact depth check below.
MAX_CONTAINERS: Final = 200_000

_generic = msgspec.json.Decoder()


def shape_refusal(body: bytes, limit: int) -> str | None:
    """Why ``body``'s JSON shape is refused: more containers than
    :data:`MAX_CONTAINERS`, or nesting deeper than ``limit``; None when it may be
    decoded.  A body with no more than ``limit`` brackets cannot be too deep (the
    ordinary request: two ``bytes.count``)."""
    brackets = body.count(b"{") + body.count(b"[")
    if brackets <= limit:
        return None
    if brackets > MAX_CONTAINERS:
        return f"more than {MAX_CONTAINERS} JSON objects and arrays"
    return f"JSON nests deeper than {limit} levels" if _nests_deeper(body, limit) else None


def _nests_deeper(body: bytes, limit: int) -> bool:
    """Whether ``body``'s JSON nests deeper than ``limit`` objects and arrays.

    msgspec decodes it (in C; it gives up near a thousand levels, which is too deep
    anyway) and the containers are walked without recursion, stopping at the first
    one too deep.  Malformed JSON is not this check's to refuse: the envelope's own
    decode names what is wrong with it."""
    try:
        value = _generic.decode(body)
    except RecursionError:
        return True
    except msgspec.DecodeError:
        return False
    level: list[Any] = [value]
    for _ in range(limit):
        below: list[Any] = []
        for v in level:
            if isinstance(v, dict):
                below.extend(x for x in v.values() if isinstance(x, dict | list))
            elif isinstance(v, list):
                below.extend(x for x in v if isinstance(x, dict | list))
        if not below:
            return False
        level = below
    return True


@dataclass(frozen=True)
class Limits:
    """What a request may carry; see ``Settings.max_depth`` and friends."""

    max_depth: int = 64
    max_id: int = 1024
    max_tag: int = 65536

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
