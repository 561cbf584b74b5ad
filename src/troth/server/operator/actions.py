"""The operator's actions: ``POST /ops/…``, beside the read-only ``GET /ops/…``.

=========================  ============================================================
``POST /ops/cancel``       ``{"id", "reason"?}``: cancel the workflow rooted at ``id``
                           (server/operator/cancel.py; ``troth cancel``)
``POST /ops/outbox/retry`` ``{"target"?, "since"?, "dryRun"?}``: failed deliveries
                           offered again with fresh attempts (``troth outbox retry``)
``POST /ops/limits/set``   ``{"group", "concurrency", "rate", "burst", "perKey"}``: set
                           a worker group's limit
                           (``troth limits set``; ``troth/flow``)
``POST /ops/limits/delete`` ``{"group"}``: delete it; its queued tasks go at once
``GET /ops/limits``        every limit with its use (``troth limits list``)
=========================  ============================================================

Like the operator API's reads, every path here needs an admin token when auth is on
(the app checks before calling in).  A refused action (400) changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from troth.engine import Engine
from troth.flow.changes import delete_limit, list_limits, set_limit
from troth.flow.limits import check_limit
from troth.machine.state import TASK_PENDING
from troth.outbox.rows import OutboxRow, RowState
from troth.protocol.address import parse_poll
from troth.protocol.records import Execute
from troth.server.delivery.loop import DeliveryLoop
from troth.server.operator.api import Refused
from troth.server.operator.cancel import MAX_REASON, cancel_workflow
from troth.store.inspection import Inspection

Answer = tuple[int, Any]

#: Failed rows one read brings while a retry looks for its matches.
PAGE: Final = 1000
#: Rows one retry's answer names.
SHOWN: Final = 20
#: Longest id an action takes.
MAX_ID: Final = 4096


class LimitBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    group: str
    concurrency: int | None = None
    #: Starts per second (a number) or ``"R/s"``, ``"R/m"``, ``"R/h"``.
    rate: float | str | None = None
    burst: int | None = None
    #: At most this many tasks of one ``troth:key`` at once.
    per_key: int | None = msgspec.field(default=None, name="perKey")


class CancelBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: str
    reason: str | None = None


class RetryBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    target: str | None = None
    since: int | None = None  # ms: only rows failed this recently
    dry_run: bool = False


@dataclass(frozen=True)
class Candidates:
    """A retry's failed rows that match, sorted by why: those to offer again, and
    those skipped because their task is no longer pending."""

    wanted: list[OutboxRow]
    not_pending: int


class OperatorActions:
    """Answers ``POST /ops/…``."""

    def __init__(self, engine: Engine, delivery: DeliveryLoop | None) -> None:
        self.engine = engine
        self.delivery = delivery
        self.routes: dict[str, Callable[[bytes], Any]] = {
            "/ops/cancel": self.cancel,
            "/ops/outbox/retry": self.retry,
            "/ops/limits/set": self.set_limit,
            "/ops/limits/delete": self.delete_limit,
        }

    def matches(self, path: str) -> bool:
        return path.rstrip("/") in self.routes

    async def answer(self, path: str, body: bytes) -> Answer:
        route = self.routes.get(path.rstrip("/"))
        if route is None:
            return 404, {"error": f"no operator action {path}; try {', '.join(self.routes)}"}
        try:
            return 200, await route(body)
        except msgspec.ValidationError as exc:
            return 400, {"error": f"bad body: {exc}"}
        except msgspec.DecodeError:
            return 400, {"error": "the body must be a JSON object"}
        except ValueError as exc:
            return 400, {"error": str(exc)}
        except Refused as exc:
            return exc.status, {"error": str(exc)}

    async def cancel(self, body: bytes) -> Any:
        req = msgspec.json.decode(body or b"{}", type=CancelBody)
        if not req.id or len(req.id) > MAX_ID:
            raise ValueError(f"id must be 1 to {MAX_ID} characters")
        if req.reason is not None and len(req.reason) > MAX_REASON:
            raise ValueError(f"reason is at most {MAX_REASON} characters")
        result = await cancel_workflow(self.engine, req.id, req.reason)
        if not result.found:
            raise Refused(404, f"no promise {req.id[:200]!r} and no workflow rooted there")
        return result.as_json()

    async def limits(self) -> Answer:
        """``GET /ops/limits``: every limit with its use."""
        found = await self.engine.run(list_limits, self.engine.clock(), read_only=False)
        return 200, {"limits": found}

    async def set_limit(self, body: bytes) -> Any:
        req = msgspec.json.decode(body or b"{}", type=LimitBody)
        limit = check_limit(req.group, req.concurrency, req.rate, req.burst, req.per_key)
        now = self.engine.clock()
        answer = await self.engine.run(set_limit(limit, now), now)
        self.engine.flow.limits = {**self.engine.flow.limits, limit.group: limit}
        return answer

    async def delete_limit(self, body: bytes) -> Any:
        req = msgspec.json.decode(body or b"{}", type=LimitBody)
        if (req.concurrency, req.rate, req.burst, req.per_key) != (None, None, None, None):
            raise ValueError("delete takes only a group")
        now = self.engine.clock()
        answer = await self.engine.run(delete_limit(req.group, now), now)
        if answer is None:
            raise Refused(404, f"group {req.group[:200]!r} has no limit")
        limits = dict(self.engine.flow.limits)
        limits.pop(req.group, None)
        self.engine.flow.limits = limits
        return answer

    async def retry(self, body: bytes) -> Any:
        req = msgspec.json.decode(body or b"{}", type=RetryBody)
        if req.since is not None and req.since <= 0:
            raise ValueError("since must be a positive number of milliseconds")
        now = self.engine.clock()
        since = None if req.since is None else now - req.since
        found = await asyncio.to_thread(
            self.engine.store.inspect, lambda ins: candidates(ins, req.target, since)
        )
        wanted = found.wanted
        answer: dict[str, Any] = {
            "matched": len(wanted) + found.not_pending,
            "taskNotPending": found.not_pending,
            "dryRun": req.dry_run,
            "rows": [r.id for r in wanted[:SHOWN]],
        }
        if req.dry_run or self.delivery is None:
            answer["retried"] = 0
            answer["newer"] = 0
            return answer
        rows = [(r.id, r.key, _task_of(r)) for r in wanted]

        clock = self.engine.clock
        retried = await self.delivery.offer_again(lambda life: life.retry(rows, clock()))
        answer["retried"] = len(retried)
        # Gone in between (sent, superseded or retried by someone else) or newer.
        answer["newer"] = len(wanted) - len(retried)
        answer["rows"] = retried[:SHOWN]
        return answer


def _task_of(row: OutboxRow) -> str | None:
    message = row.message
    return message.task_id if isinstance(message, Execute) else None


def target_matches(address: str, target: str | None) -> bool:
    """``--target``: a row's exact address, or a worker group (that of a ``poll://``
    address, either cast)."""
    if target is None or address == target:
        return True
    poll = parse_poll(address)
    return poll is not None and poll.group == target.lower()


def candidates(ins: Inspection, target: str | None, since: int | None) -> Candidates:
    """The failed rows that match, newest of each key only, and which are still
    wanted: an ``unblock`` always (its promise settled once, for good), an ``execute``
    while its task is pending (a task acquired, suspended, halted or fulfilled since
    wants no execute)."""
    newest: dict[str, OutboxRow] = {}
    before: int | None = None
    while True:
        page = ins.outbox(str(RowState.FAILED), before, PAGE)
        for row in page:
            if since is not None and row.updated_at < since:
                continue
            if target_matches(row.address, target) and row.key not in newest:
                newest[row.key] = row
        if len(page) < PAGE:
            break
        before = page[-1].id
    rows = sorted(newest.values(), key=lambda r: r.id)
    tasks = ins.tasks([t for r in rows if (t := _task_of(r)) is not None])
    wanted: list[OutboxRow] = []
    not_pending = 0
    for row in rows:
        task_id = _task_of(row)
        if task_id is not None:
            task = tasks.get(task_id)
            if task is None or task.state != TASK_PENDING:
                not_pending += 1
                continue
        wanted.append(row)
    return Candidates(wanted, not_pending)
