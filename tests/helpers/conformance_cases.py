"""Corpus cases whose recorded task-facing answer predates an internal step.

The reference run that produced the corpus fires internal steps only where its
``.driven.ndjson`` says so, so an answer may show the wake pipeline *before* a step
that was already enabled: a task still ``acquired`` after its lease ran out (r5 not
fired), or still ``suspended`` after its awaited promise timed out (r1/r4 not fired).
troth fires every enabled step, eagerly or on ``debug.tick``, so it answers at
quiescence (README "Replaying a case").

For each such case we record why, and the answers expected *after* the step, derived by
hand from SPEC.md, keyed by the 0-based index of the external row (``tau.*`` rows not
counted).  troth must give exactly those answers; every other row is compared with the
recording as usual.  Later rows sometimes differ only as a consequence (a refused fence
never created the promise a later request touches); those are derived the same way.
For non-2xx answers only the status is compared, so their data is ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TARGET = {"resonate:origin": "o", "resonate:target": "poll://any@w1"}
EXTERNAL = {"resonate:external": "true", "resonate:origin": "o"}

# Every lease case below starts with a task acquired with ttl 500 and a request
# arriving after ``createdAt + 500``: r5 (SPEC §5, processLeaseTimeout) is enabled -
# task acquired, expiresAt <= now, promise pending - so at quiescence the task is
# ``pending`` (version kept), and acquired-only requests answer 409 (SPEC §4.2 common
# pattern: "T̂ not acquired -> 409").
LEASE = "lease expired (r5 due) before this request; the recording has r5 unfired"


@dataclass(frozen=True)
class Quiescent:
    """Why the recording differs, and the post-step answers ``{row index: (status, data)}``."""

    reason: str
    expected: dict[int, tuple[int, Any]] = field(default_factory=dict)


def promise(
    pid: str,
    state: str,
    tags: dict[str, str],
    timeout_at: int,
    created_at: int,
    settled_at: int | None = None,
) -> dict[str, Any]:
    """A wire promise record (SPEC §2.1) with empty param/value."""
    record: dict[str, Any] = {
        "id": pid,
        "state": state,
        "param": {},
        "value": {},
        "tags": tags,
        "timeoutAt": timeout_at,
        "createdAt": created_at,
    }
    if settled_at is not None:
        record["settledAt"] = settled_at
    return record


AT_QUIESCENCE: dict[str, Quiescent] = {
    "016-P-02--birth--born-live-untargeted_at_p-live+shape-targeted+t-acquired_lea": Quiescent(
        f"{LEASE}: o.x0 acquired at 1054 (ttl 500, expires 1554); the fence at 7104 finds "
        "it pending -> 409 and o.a0 is never created",
        {1: (409, None)},
    ),
    "023-P-02--branch--idempotent-echo_at_p-logically-dead+shape-external": Quiescent(
        f"{LEASE}: o.x0 expires 1554; the fence at 7104 answers 409, so o.a0 does not "
        "exist and the promise.create at 42498 (timeoutAt 31007 <= now) is a born-dead "
        "birth: rejected_timedout with createdAt = settledAt = timeoutAt (SPEC §3)",
        {
            1: (409, None),
            2: (
                200,
                {"promise": promise("o.a0", "rejected_timedout", EXTERNAL, 31007, 31007, 31007)},
            ),
        },
    ),
    "038-P-03--branch--settled_at_p-live+shape-targeted+t-acquired_lease-expired+v": Quiescent(
        f"{LEASE}: o.x0 acquired at 1070 (expires 1570); the first fence (1088) holds, "
        "the settle fence at 6521 finds the task pending -> 409",
        {2: (409, None)},
    ),
    "049-P-03--branch--unsettable_at_p-rejected_timedout+shape-external": Quiescent(
        f"{LEASE}: o.x0 expires 1518; the fence at 28987 answers 409 (the later settle "
        "is a 400 door check either way)",
        {1: (409, None)},
    ),
    "082-T-01--branch--found_at_p-live+shape-targeted+t-suspended": Quiescent(
        "o.x suspended on o.a at 1020; o.a times out at 1500, so by 2040 r1 settles it "
        "and r4 resumes o.x (suspended -> pending, resumes [o.a], SPEC §5 resumeOne); "
        "the recording has r1/r4 unfired and shows suspended",
        {3: (200, {"task": {"id": "o.x", "state": "pending", "version": 1, "resumes": 1}})},
    ),
    "100-T-03--branch--task-wrong-state_at_p-live+shape-targeted+t-acquired_lease-": Quiescent(
        f"{LEASE}: o.x0 expires 1500 and returns to pending at version 1, so the acquire "
        "of version 1 at 2018 succeeds: acquired, version 2, ttl 581, pid p1 (SPEC T-03)",
        {
            1: (
                200,
                {
                    "task": {
                        "id": "o.x0",
                        "state": "acquired",
                        "version": 2,
                        "resumes": 0,
                        "ttl": 581,
                        "pid": "p1",
                    },
                    "promise": promise("o.x0", "pending", TARGET, 31000, 1000),
                },
            )
        },
    ),
    "142-T-06--branch--empty-actions_at_p-logically-dead+shape-external": Quiescent(
        f"{LEASE}: o.x0 expires 1540; the fence at 28645 answers 409 (the later empty "
        "suspend is a 400 door check either way)",
        {1: (409, None)},
    ),
    "163-T-06--branch--self-awaited_at_p-resolved+shape-targeted+t-fulfilled+versi": Quiescent(
        f"{LEASE}: o.x0 expires 1536; task.fulfill at 1988 finds it pending -> 409 (the "
        "later self-await suspend is a 400 door check either way)",
        {1: (409, None)},
    ),
    "197-T-08--branch--released_at_p-live+shape-targeted+t-acquired_lease-expired+": Quiescent(
        f"{LEASE}: o.x0 acquired at 1237 with ttl 333 (expires 1570); the release at "
        "1623 finds it pending -> 409",
        {2: (409, None)},
    ),
    "223-T-09--branch--task-absent_at_p-rejected_timedout+shape-external": Quiescent(
        f"{LEASE}: o.x0 expires 1518; the fence at 28987 answers 409, so o.a0 never "
        "exists and register_listener on it at 69024 is 404 (SPEC P-05 step 2)",
        {1: (409, None), 2: (404, None)},
    ),
    "235-T-10--branch--task-absent_at_p-resolved+shape-external": Quiescent(
        f"{LEASE}: o.x0 expires 1535; both fences (11681, 11776) find it pending -> 409",
        {1: (409, None), 2: (409, None)},
    ),
}
