"""Searches (P-06, T-11, S-04): served, not 501 (SPEC.md §10.24 leaves them to us).

Semantics, documented in docs/protocol.md: filter by ``state`` (of the projected
view, so a promise past its deadline is found as timed out) and by ``tags`` (every
given pair present); results in id order; ``limit`` 1..1000 (default 100, 10 for
schedules); ``cursor`` is opaque and continues after the last id of the page.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Collection
from typing import TypeVar

from troth.machine.state import Response, error, project, view
from troth.machine.tx import Tx
from troth.protocol import requests as rq
from troth.protocol.records import (
    PENDING,
    PROMISE_STATES,
    REJECTED_TIMEDOUT,
    RESOLVED,
    TASK_STATES,
    Promise,
    Task,
)

MAX_LIMIT = 1000
T = TypeVar("T")


class SearchError(Exception):
    pass


def encode_cursor(last_id: str) -> str:
    return base64.urlsafe_b64encode(last_id.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> str | None:
    if cursor is None or cursor == "":
        return None
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return base64.urlsafe_b64decode(padded.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise SearchError("Invalid cursor") from None


def check_limit(limit: int | None, default: int) -> int:
    if limit is None:
        return default
    if not 1 <= limit <= MAX_LIMIT:
        raise SearchError(f"limit must be between 1 and {MAX_LIMIT}")
    return limit


def page(
    fetch: Callable[[str | None, int], list[T]],
    keep: Callable[[T], object | None],
    ident: Callable[[T], str],
    after: str | None,
    limit: int,
) -> tuple[list[object], str | None]:
    """Fill one page from id-ordered candidates, keeping those ``keep`` maps to a value."""
    out: list[object] = []
    last: str | None = after
    while len(out) < limit:
        batch = fetch(last, max(limit - len(out), 50))
        if not batch:
            return out, None
        for item in batch:
            last = ident(item)
            kept = keep(item)
            if kept is not None:
                out.append(kept)
                if len(out) == limit:
                    break
    return out, encode_cursor(last) if last is not None else None


def promise_search(tx: Tx, req: rq.PromiseSearch, now: int) -> Response:
    try:
        limit = check_limit(req.limit, 100)
        after = decode_cursor(req.cursor)
    except SearchError as exc:
        return error(400, str(exc))
    if req.state is not None and req.state not in PROMISE_STATES:
        return error(400, f"Invalid state filter: {req.state!r}")
    states: Collection[str] | None = None
    if req.state is not None:
        # A stored pending promise may read as resolved (timer) or timed out.
        states = {req.state, PENDING} if req.state in (RESOLVED, REJECTED_TIMEDOUT) else {req.state}

    def keep(p: Promise) -> object | None:
        q = project(p, now)
        if req.state is not None and q.state != req.state:
            return None
        return q.record()

    items, cursor = page(
        lambda a, n: list(tx.scan_promises(states, req.tags, a, n)),
        keep,
        lambda p: p.id,
        after,
        limit,
    )
    body: dict[str, object] = {"promises": items}
    if cursor is not None:
        body["cursor"] = cursor
    return Response(200, body)


def task_search(tx: Tx, req: rq.TaskSearch, now: int) -> Response:
    try:
        limit = check_limit(req.limit, 100)
        after = decode_cursor(req.cursor)
    except SearchError as exc:
        return error(400, str(exc))
    if req.state is not None and req.state not in TASK_STATES:
        return error(400, f"Invalid state filter: {req.state!r}")
    # Any stored state may read as fulfilled through a dead promise.
    states = None if req.state in (None, "fulfilled") else {req.state}

    def keep(t: Task) -> object | None:
        p = tx.get_promise(t.id)
        u = view(t, project(p, now)) if p is not None else t
        if req.state is not None and u.state != req.state:
            return None
        return u.record()

    items, cursor = page(
        lambda a, n: list(tx.scan_tasks(states, a, n)), keep, lambda t: t.id, after, limit
    )
    body: dict[str, object] = {"tasks": items}
    if cursor is not None:
        body["cursor"] = cursor
    return Response(200, body)


def schedule_search(tx: Tx, req: rq.ScheduleSearch, now: int) -> Response:
    try:
        limit = check_limit(req.limit, 10)
        after = decode_cursor(req.cursor)
    except SearchError as exc:
        return error(400, str(exc))
    items, cursor = page(
        lambda a, n: list(tx.scan_schedules(req.tags, a, n)),
        lambda s: s,
        lambda s: s.id,
        after,
        limit,
    )
    body: dict[str, object] = {"schedules": items}
    if cursor is not None:
        body["cursor"] = cursor
    return Response(200, body)
