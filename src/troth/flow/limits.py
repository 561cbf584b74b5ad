"""What a limit is, and which group a delivery address belongs to.

A limit caps the tasks of one worker group (the group of ``poll://any@GROUP`` and
``poll://uni@GROUP/…``) that hold a *slot* at once (``concurrency``), how many may
start per second (``rate``, a token bucket of ``burst`` tokens), or both.  A task
holds a slot while it is acquired, and from the moment its ``execute`` was let
through until a worker acquires it (a *reservation*: the message is on its way to a
worker, so the slot is spoken for).  Tasks beyond the limit are *held*: pending,
with no ``execute`` sent, in a queue of their group ordered by ``troth:priority``
(higher first) and then by creation.  A *start* is a task let through (its
``execute`` written) or acquired without having been let through; the rate counts
starts.  Limits live in the store (table ``flow_limits``), so that they outlive a
restart and every node sees the same ones.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final
from urllib.parse import urlsplit

import msgspec

from troth.protocol.address import nats_subject, parse_poll
from troth.protocol.records import Tags

#: The tag that orders a group's held tasks (an integer as a string; higher first).
TAG_PRIORITY: Final = "troth:priority"
#: The highest priority (and the lowest, negated) a task is queued with: a 32-bit
#: column; a tag beyond it counts as the bound.
MAX_PRIORITY: Final = 2**31 - 1
#: How ``troth:priority`` is written: "an integer as a string", plainly.
_INTEGER: Final = re.compile(r"-?[0-9]+")
#: The tag that names a task's fairness key (``--per-key``, round-robin across keys).
TAG_KEY: Final = "troth:key"
#: Longest key kept as written (UTF-8 bytes); a longer one is kept as its SHA-256,
#: so that an index entry stays small (PostgreSQL refuses one past ~2700 bytes).
MAX_KEY: Final = 200
#: Longest group name a limit takes (as the longest poll group the server serves).
MAX_GROUP: Final = 256
#: Largest concurrency a limit takes.
MAX_CONCURRENCY: Final = 1_000_000
#: Largest rate (starts per second) and burst a limit takes.
MAX_RATE: Final = 1_000_000.0
MAX_BURST: Final = 1_000_000
#: What the ``concurrency`` column holds for a limit with a rate only: a node of the
#: release before rates, sharing the database during an upgrade, reads it as no cap.
UNCAPPED: Final = 2**31 - 1
#: Per-unit multipliers of a rate written as ``R/s``, ``R/m`` or ``R/h``.
_PER: Final = {"s": 1.0, "m": 1 / 60, "h": 1 / 3600}


class Limit(msgspec.Struct, frozen=True, omit_defaults=True):
    """One group's limit: at most ``concurrency`` tasks hold a slot at once, and at
    most ``rate`` start per second on average with up to ``burst`` at once (None:
    that cap is off; a limit has at least one)."""

    group: str
    concurrency: int | None = None
    rate: float | None = None
    burst: int | None = None
    #: At most this many tasks of one ``troth:key`` hold a slot at once.
    per_key: int | None = None

    @property
    def bucket(self) -> int:
        """The token bucket's size: ``burst``, 1 when not given."""
        return self.burst or 1

    def interval(self) -> float:
        """Milliseconds between two starts at the rate (the bucket's refill time for
        one token)."""
        assert self.rate is not None
        return 1000.0 / self.rate


#: The caps an entry of the ``flow_limits`` setting names.
CAPS: Final = ("concurrency", "rate", "burst", "per_key")


def parse_limits(text: str) -> list[Limit]:
    """The limits of the ``flow_limits`` setting: ``GROUP:concurrency=N,rate=R/s,burst=B``
    entries separated by ``;`` (each key optional, one of concurrency and rate
    needed).  ValueError says which entry is wrong and why."""
    found: dict[str, Limit] = {}
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        group, colon, caps = entry.partition(":")
        if not colon:
            raise ValueError(f"flow_limits: {entry!r} is not GROUP:concurrency=N,rate=R/s,burst=B")
        given: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in caps.split(","))):
            key, equals, value = part.partition("=")
            key = key.strip()
            if not equals or key not in CAPS or key in given:
                raise ValueError(
                    f"flow_limits: {part!r} in {entry!r}: use concurrency=, rate=, burst=, per_key="
                )
            given[key] = value.strip()
        try:
            limit = check_limit(
                group.strip(),
                _integer(given.get("concurrency")),
                given.get("rate"),
                _integer(given.get("burst")),
                _integer(given.get("per_key")),
            )
        except ValueError as exc:
            raise ValueError(f"flow_limits: {entry!r}: {exc}") from None
        if limit.group in found:
            raise ValueError(f"flow_limits: group {limit.group!r} is given twice")
        found[limit.group] = limit
    return list(found.values())


def limits_text(table: dict[str, object]) -> str:
    """The ``flow_limits`` setting from ``troth.toml``'s ``[flow_limits]`` table
    (``payments = { concurrency = 5 }``), as the flag writes it."""
    entries = []
    for group, caps in table.items():
        if not isinstance(caps, dict):
            raise ValueError(
                f'flow_limits: {group} = {{ concurrency = N, rate = "R/s", burst = B }}'
            )
        entries.append(f"{group}:" + ",".join(f"{k}={v}" for k, v in caps.items()))
    return ";".join(entries)


def _integer(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an integer") from None


def stored_limit(
    group: str,
    concurrency: int | None,
    rate: float | None,
    burst: int | None,
    per_key: int | None = None,
) -> Limit:
    """A limit from its row (``flow_limits``)."""
    capped = None if concurrency is None or int(concurrency) >= UNCAPPED else int(concurrency)
    return Limit(
        str(group),
        capped,
        None if rate is None else float(rate),
        None if burst is None else int(burst),
        None if per_key is None else int(per_key),
    )


def limit_row(limit: Limit, now: int) -> tuple[str, int, float | None, int | None, int | None, int]:
    """The row of ``flow_limits`` a limit is stored as (grp, concurrency, rate, burst,
    per_key, updated_at): without a concurrency it reads as no cap (:data:`UNCAPPED`)
    to a node of a release before rates and keys."""
    concurrency = UNCAPPED if limit.concurrency is None else limit.concurrency
    return (limit.group, concurrency, limit.rate, limit.burst, limit.per_key, now)


def held_row(held: Held) -> tuple[str, str, str, int, int, str, int]:
    """The row of ``flow_held`` a queued task is stored as."""
    return (
        held.task_id,
        held.group,
        held.address,
        held.priority,
        held.created_at,
        held.key,
        held.turn,
    )


def stored_held(
    task_id: str, group: str, address: str, priority: int, created_at: int, key: str, turn: int
) -> Held:
    """A queued task from its row (``flow_held``)."""
    return Held(
        str(task_id), str(group), str(address), int(priority), int(created_at), str(key), int(turn)
    )


def next_start(limit: Limit, tat: float, now: int) -> float:
    """When the next start of the group is allowed (ms; ``<= now``: at once), given
    its *theoretical arrival time* ``tat``: a token bucket kept as one number (the
    generic cell rate algorithm), so that a store keeps one column per group."""
    tolerance = limit.interval() * (limit.bucket - 1)
    return max(tat, now) - tolerance


def take_start(limit: Limit, tat: float, now: int) -> float:
    """The bucket after one start at ``now`` (taken even when none is free: a
    start the server may not refuse leaves a debt that delays the next ones)."""
    return max(tat, now) + limit.interval()


class Held(msgspec.Struct, frozen=True):
    """A task waiting for a slot of its group: where its ``execute`` goes once
    admitted, and its place in the queue (priority, then turn, then creation, then
    id).  Its *turn* is one past the last queued task of its key (and at least one
    past the group's last let through), so that keys take turns: a key with ten
    thousand tasks queued does not starve a key with one."""

    task_id: str
    group: str
    address: str
    priority: int
    created_at: int
    key: str = ""
    turn: int = 0


def held_order(held: Held) -> tuple[int, int, int, str]:
    """A queued task's place: higher priority first, then its turn, then first
    created, then id."""
    return (-held.priority, held.turn, held.created_at, held.task_id)


def key_of(tags: Tags) -> str:
    """``troth:key`` as kept (a long one by its SHA-256); "" when absent."""
    value = tags.get(TAG_KEY, "")
    if len(value.encode()) <= MAX_KEY:
        return value
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()


def group_of(address: str) -> str | None:
    """What a limit on tasks sent to ``address`` is named by: the worker group of a
    ``poll://`` address (lower-cased, as delivery reads it), or the push target of
    an ``http(s)://`` URL (``scheme://host[:port]``, lower-cased, without its path)
    or of a ``nats://`` subject (``nats://subject``, as written); None for anything
    else."""
    parsed = parse_poll(address)
    if parsed is not None:
        return parsed.group
    if address.startswith(("http://", "https://", "HTTP://", "HTTPS://")):
        try:
            parts = urlsplit(address)
            host, port = parts.hostname, parts.port
        except ValueError:
            return None
        if not host:
            return None
        shown = f"[{host}]" if ":" in host else host
        return f"{parts.scheme.lower()}://{shown}" + (f":{port}" if port is not None else "")
    subject = nats_subject(address)
    return None if subject is None else "nats://" + subject


def priority_of(tags: Tags) -> int:
    """``troth:priority`` as an integer; 0 when absent or not an integer written plainly
    (ASCII digits with an optional ``-``: not ``" 5"``, ``"1_0"`` or other digits,
    which Python's ``int`` would take), and one beyond :data:`MAX_PRIORITY` either way
    as that bound (what the store's column holds)."""
    value = tags.get(TAG_PRIORITY)
    if value is None or _INTEGER.fullmatch(value) is None:
        return 0
    return max(-MAX_PRIORITY, min(MAX_PRIORITY, int(value)))


def parse_rate(value: object) -> float | None:
    """A rate from an operator's input: a number of starts per second, or a string
    ``R/s``, ``R/m`` or ``R/h``; None stays None.  ValueError says what is wrong."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("rate must be a number of starts per second, or R/s, R/m, R/h")
    if isinstance(value, (int, float)):
        rate = float(value)
    elif isinstance(value, str):
        text, _, unit = value.strip().partition("/")
        if unit not in ("", *_PER):
            raise ValueError(f"rate {value!r}: write it as R/s, R/m or R/h")
        try:
            rate = float(text) * _PER[unit or "s"]
        except ValueError:
            raise ValueError(f"rate {value!r}: write it as R/s, R/m or R/h") from None
    else:
        raise ValueError("rate must be a number of starts per second, or R/s, R/m, R/h")
    if not 0 < rate <= MAX_RATE or rate != rate:
        raise ValueError(f"rate must be above 0 and at most {MAX_RATE:,.0f}/s")
    return rate


def rate_text(rate: float) -> str:
    """A rate as people write it: ``10/s``, ``6/m``, ``2/h`` (the unit that makes it
    at least one, rounded to 4 significant digits)."""
    for per, unit in ((1.0, "s"), (60.0, "m")):
        if rate * per >= 1:
            return f"{rate * per:.4g}/{unit}"
    return f"{rate * 3600:.4g}/h"


def check_limit(
    group: str,
    concurrency: object,
    rate: object = None,
    burst: object = None,
    per_key: object = None,
) -> Limit:
    """A limit from an operator's input, or ValueError saying what is wrong."""
    if not isinstance(group, str) or not group.strip():
        raise ValueError("a limit needs a group: the worker group of poll://any@GROUP")
    if len(group.encode()) > MAX_GROUP:
        raise ValueError(f"a group is at most {MAX_GROUP} bytes")
    if "://" in group:
        if group_of(group) != group:
            raise ValueError(
                "a push target is written https://host[:port], http://host[:port] (lower "
                "case, without a path) or nats://subject"
            )
    elif group != group.lower() or "/" in group or "@" in group:
        raise ValueError(
            "a group is written as in poll://any@GROUP: lower case, without '/' or '@'"
        )
    if concurrency is not None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int):
            raise ValueError("concurrency must be an integer")
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be between 1 and {MAX_CONCURRENCY}")
    per_second = parse_rate(rate)
    if burst is not None:
        if per_second is None:
            raise ValueError("burst goes with a rate: --rate R/s --burst B")
        if isinstance(burst, bool) or not isinstance(burst, int):
            raise ValueError("burst must be an integer")
        if not 1 <= burst <= MAX_BURST:
            raise ValueError(f"burst must be between 1 and {MAX_BURST}")
    if per_key is not None:
        if isinstance(per_key, bool) or not isinstance(per_key, int):
            raise ValueError("per-key must be an integer")
        if not 1 <= per_key <= MAX_CONCURRENCY:
            raise ValueError(f"per-key must be between 1 and {MAX_CONCURRENCY}")
    if concurrency is None and per_second is None and per_key is None:
        raise ValueError("a limit needs a concurrency, a rate, a per-key limit, or some of them")
    return Limit(group, concurrency, per_second, burst, per_key)
