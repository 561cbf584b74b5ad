"""Searches (P-06, T-11, S-04): served, not 501 (SPEC.md §10.24 leaves them to us).

Semantics, documented in docs/protocol.md: filter by ``state`` (of the projected
view, so a promise past its deadline is found as timed out), by ``tags`` (every
given pair present) and, a troth extension, by ``idPrefix`` (ids starting with it:
what a prefix token may see, server/ingress/auth.py); results in id order; ``limit``
1..1000 (default 100, 10 for schedules); ``cursor`` is opaque and continues after
the last id of the page.
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
    Schedule,
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


def paged(
    name: str,
    fetch: Callable[[str | None, int], list[T]],
    keep: Callable[[T], object | None],
    ident: Callable[[T], str],
    req: rq.PromiseSearch | rq.TaskSearch | rq.ScheduleSearch,
    default_limit: int,
    exact: Callable[[str], T | None],
) -> Response:
    """Fill one page from id-ordered candidates, keeping those ``keep`` maps to a value;
    the answer is ``{name: [...], "cursor"?}`` (no cursor on the last page).

    With an ``idPrefix`` the ids starting with it are one run in code-point order
    (every store orders ids so), and the run begins with the prefix itself: so the
    page starts with ``exact(prefix)`` (the candidate of exactly that id, if it
    passes the filters), scans on after it, and ends at the first id outside it."""
    try:
        limit = check_limit(req.limit, default_limit)
        last = decode_cursor(req.cursor)
    except SearchError as exc:
        return error(400, str(exc))
    prefix = req.id_prefix or ""
    out: list[object] = []
    if prefix and (last is None or last < prefix):
        first = exact(prefix)
        last = prefix
        kept = None if first is None else keep(first)
        if kept is not None:
            out.append(kept)
    exhausted = False
    while len(out) < limit and not exhausted:
        batch = fetch(last, max(limit - len(out), 50))
        if not batch:
            exhausted = True
            break
        for item in batch:
            id = ident(item)
            if not id.startswith(prefix):
                exhausted = True
                break
            last = id
            kept = keep(item)
            if kept is not None:
                out.append(kept)
                if len(out) == limit:
                    break
    body: dict[str, object] = {name: out}
    if not exhausted and last is not None:
        body["cursor"] = encode_cursor(last)
    return Response(200, body)


def promise_search(tx: Tx, req: rq.PromiseSearch, now: int) -> Response:
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

    def fetch(after: str | None, n: int) -> list[Promise]:
        return tx.scan_promises(states, req.tags, after, n)

    def exact(id: str) -> Promise | None:
        p = tx.get_promise(id)
        if p is None or (states is not None and p.state not in states):
            return None
        return p if all(p.tags.get(k) == v for k, v in req.tags.items()) else None

    return paged("promises", fetch, keep, lambda p: p.id, req, 100, exact)


def task_search(tx: Tx, req: rq.TaskSearch, now: int) -> Response:
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

    def fetch(after: str | None, n: int) -> list[Task]:
        return tx.scan_tasks(states, after, n)

    def exact(id: str) -> Task | None:
        t = tx.get_task(id)
        return None if t is None or (states is not None and t.state not in states) else t

    return paged("tasks", fetch, keep, lambda t: t.id, req, 100, exact)


def schedule_search(tx: Tx, req: rq.ScheduleSearch, now: int) -> Response:
    def fetch(after: str | None, n: int) -> list[Schedule]:
        return tx.scan_schedules(req.tags, after, n)

    def exact(id: str) -> Schedule | None:
        s = tx.get_schedule(id)
        if s is None or not all(s.promise_tags.get(k) == v for k, v in req.tags.items()):
            return None
        return s

    return paged("schedules", fetch, lambda s: s, lambda s: s.id, req, 10, exact)
