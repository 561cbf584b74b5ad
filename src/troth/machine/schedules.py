"""Schedule requests S-01 … S-03 (SPEC.md §4.3).

troth's doors go beyond the specification where the calendar needs it: an invalid
cron expression, a ``/`` in the schedule id, or a ``promiseId`` template without
``{{.timestamp}}`` are refused with 400, because each would break the calendar
contract of §5.3 (occurrence ids injective in the instant and across schedules).
"""

from __future__ import annotations

from troth.machine.calendar import CronError, next_after, parse_cron
from troth.machine.state import Response, error
from troth.machine.tx import Tx
from troth.protocol import requests as rq
from troth.protocol.records import Schedule, is_timer_targeted


def schedule_get(tx: Tx, req: rq.ScheduleGet, now: int) -> Response:
    s = tx.get_schedule(req.id)
    if s is None:
        return error(404, "Schedule not found")
    return Response(200, {"schedule": s})


def schedule_create(tx: Tx, req: rq.ScheduleCreate, now: int) -> Response:
    if is_timer_targeted(req.promise_tags):
        return error(400, "resonate:timer and resonate:target cannot be combined in promiseTags")
    if not req.id or "/" in req.id:
        return error(400, "schedule id must be non-empty and must not contain '/'")
    if "{{.timestamp}}" not in req.promise_id:
        return error(400, "promiseId must contain {{.timestamp}} so occurrences get distinct ids")
    try:
        cron = parse_cron(req.cron)
    except CronError as exc:
        return error(400, f"Invalid cron expression: {exc}")
    existing = tx.get_schedule(req.id)
    if existing is not None:
        return Response(200, {"schedule": existing})
    s = Schedule(
        id=req.id,
        cron=req.cron,
        promise_id=req.promise_id,
        promise_timeout=req.promise_timeout,
        promise_param=req.promise_param,
        promise_tags=req.promise_tags,
        created_at=now,
        next_run_at=next_after(cron, now),
    )
    tx.set_schedule(s)
    return Response(200, {"schedule": s})


def schedule_delete(tx: Tx, req: rq.ScheduleDelete, now: int) -> Response:
    if tx.get_schedule(req.id) is None:
        return error(404, "Schedule not found")
    tx.del_schedule(req.id)
    return Response(200, {})
