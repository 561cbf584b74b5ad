"""What a limit is, and which group a delivery address belongs to.

A limit caps the tasks of one worker group (the group of ``poll://any@GROUP`` and
``poll://uni@GROUP/…``) that hold a *slot* at once.  A task holds a slot while it is
acquired, and from the moment its ``execute`` was let through until a worker
acquires it (a *reservation*: the message is on its way to a worker, so the slot is
spoken for).  Tasks beyond the limit are *held*: pending, with no ``execute`` sent,
in a queue of their group ordered by ``troth:priority`` (higher first) and then by
creation.  Limits live in the store (table ``flow_limits``), so that they outlive a
restart and every node sees the same ones.
"""

from __future__ import annotations

from typing import Final

import msgspec

from troth.protocol.address import parse_poll
from troth.protocol.records import Tags

#: The tag that orders a group's held tasks (an integer as a string; higher first).
TAG_PRIORITY: Final = "troth:priority"
#: The tag that names a task's fairness key (reserved for per-key limits).
TAG_KEY: Final = "troth:key"
#: Longest group name a limit takes (as the longest poll group the server serves).
MAX_GROUP: Final = 256
#: Largest concurrency a limit takes.
MAX_CONCURRENCY: Final = 1_000_000


class Limit(msgspec.Struct, frozen=True, omit_defaults=True):
    """One group's limit: at most ``concurrency`` tasks hold a slot at once."""

    group: str
    concurrency: int


class Held(msgspec.Struct, frozen=True):
    """A task waiting for a slot of its group: where its ``execute`` goes once
    admitted, and its place in the queue (priority, then creation, then id)."""

    task_id: str
    group: str
    address: str
    priority: int
    created_at: int


def held_order(held: Held) -> tuple[int, int, str]:
    """A queued task's place: higher priority first, then first created, then id."""
    return (-held.priority, held.created_at, held.task_id)


def group_of(address: str) -> str | None:
    """The worker group of a ``poll://`` address (lower-cased, as delivery reads it);
    None for anything else (push targets are not limited)."""
    parsed = parse_poll(address)
    return None if parsed is None else parsed.group


def priority_of(tags: Tags) -> int:
    """``troth:priority`` as an integer; 0 when absent or not an integer."""
    value = tags.get(TAG_PRIORITY)
    if value is None:
        return 0
    try:
        return int(value)
    except ValueError:
        return 0


def check_limit(group: str, concurrency: object) -> Limit:
    """A limit from an operator's input, or ValueError saying what is wrong."""
    if not isinstance(group, str) or not group.strip():
        raise ValueError("a limit needs a group: the worker group of poll://any@GROUP")
    if len(group.encode()) > MAX_GROUP:
        raise ValueError(f"a group is at most {MAX_GROUP} bytes")
    if group != group.lower() or "/" in group or "@" in group:
        raise ValueError(
            "a group is written as in poll://any@GROUP: lower case, without '/' or '@'"
        )
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise ValueError("concurrency must be an integer")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"concurrency must be between 1 and {MAX_CONCURRENCY}")
    return Limit(group, concurrency)
