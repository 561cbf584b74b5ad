"""A workflow's timeline: its promises' events and its tasks' events, in one order.

What the store records, and so what can be shown with a time:

* a promise's ``created_at`` and ``settled_at``;
* a task's creation (with its promise, at the promise's ``created_at``) and its
  fulfilment (the promise settling fulfils the task in the same transaction, so at
  ``settled_at``);
* every ``execute`` written for a task (an outbox row: ``created_at``, the version it
  offers, the address, and how its delivery went: ``state``, ``attempts``,
  ``last_code``, ``updated_at``), which is when the task was pending at that version;
* for the lease held now, ``expires_at - ttl``: the last acquire or heartbeat.

What it does not record: when a task was acquired (only that it was, since the
version counts acquisitions), by which pid (only the holder of the lease now), and
when a task was suspended, released or its lease lapsed.  Those events are listed
with no time (``at`` is None), placed after the last event that must have preceded
them (``after``), and say so: storing their times would add a write to the request
path, which the dashboard must not cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from troth.outbox.rows import OutboxRow
from troth.plural import counted
from troth.protocol.records import PENDING, Promise, Task, TaskState

ACQUIRED: Final = TaskState.ACQUIRED.value
SUSPENDED: Final = TaskState.SUSPENDED.value
HALTED: Final = TaskState.HALTED.value
FULFILLED: Final = TaskState.FULFILLED.value

#: ``execute`` rows read per task (newest first; older ones are left out and said so).
EXECUTES_PER_TASK: Final = 20
#: Events of no recorded time that follow everything of their millisecond.
LAST_AT_ITS_TIME: Final = frozenset({"suspended", "halted"})


@dataclass
class Event:
    #: When, in ms; None: not recorded.
    at: int | None
    #: Where it sorts: ``at``, or the time of the last event that must come before it.
    after: int
    #: The promise (or task: co-keyed) the event is about.
    id: str
    #: ``promise``, ``task`` or ``delivery``.
    kind: str
    #: ``created``, ``resolved``…, ``task created``, ``acquired``, ``execute``…
    event: str
    text: str
    version: int | None = None
    pid: str | None = None
    #: The outbox row (``delivery`` events).
    row: int | None = None
    state: str | None = None

    def as_json(self) -> dict[str, Any]:
        out = {
            "at": self.at,
            "after": self.after,
            "id": self.id,
            "kind": self.kind,
            "event": self.event,
            "text": self.text,
        }
        for k in ("version", "pid", "row", "state"):
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        return out


def timeline(
    promises: list[Promise],
    tasks: dict[str, Task],
    executes: dict[str, list[OutboxRow]],
) -> list[Event]:
    """Every event of ``promises`` and their ``tasks`` (with the tasks' ``executes``,
    newest first as read), oldest first."""
    keyed: list[tuple[int, int, Event]] = []
    for p in promises:
        events = _promise_events(p)
        t = tasks.get(p.id)
        if t is not None:
            events += _task_events(p, t, executes.get(p.id, []), promises)
        # Within one promise the order made here is the causal one; across promises
        # the times decide (a time not recorded sorts at the event it follows).
        keyed += [(e.after, len(keyed) + i, e) for i, e in enumerate(events)]
    keyed.sort(key=lambda k: (k[0], _rank(k[2]), k[1]))
    return [e for _, _, e in keyed]


def _rank(e: Event) -> int:
    """Order within one millisecond: a promise's creation or settlement first (what a
    task does in that instant follows from it: a settled promise resumes its awaiter
    in the same transaction), then task and delivery events, and last a state entered
    at no recorded time after the others (suspended: after the promises it awaits
    were created)."""
    if e.kind == "promise":
        return 0
    return 2 if e.event in LAST_AT_ITS_TIME else 1


def _promise_events(p: Promise) -> list[Event]:
    out = [Event(p.created_at, p.created_at, p.id, "promise", "created", "promise created")]
    if p.state != PENDING and p.settled_at is not None:
        out.append(
            Event(p.settled_at, p.settled_at, p.id, "promise", p.state, f"promise {p.state}")
        )
    return out


def _task_events(p: Promise, t: Task, rows: list[OutboxRow], tree: list[Promise]) -> list[Event]:
    """A task's events: created (v0), per version the executes written at it, then its
    acquisition (the next version) and what ended that lease, as far as recorded."""
    mine = sorted((r for r in rows if getattr(r.message, "task_id", None) == t.id), key=_id)
    by_version: dict[int, list[OutboxRow]] = {}
    for r in mine:
        by_version.setdefault(int(getattr(r.message, "version", 0)), []).append(r)
    out = [
        Event(p.created_at, p.created_at, t.id, "task", "task created", "task created", 0),
    ]
    last = p.created_at
    if len(rows) >= EXECUTES_PER_TASK and mine:
        out.append(
            Event(
                None,
                last,
                t.id,
                "task",
                "older executes",
                f"older executes not shown (the newest {EXECUTES_PER_TASK} are)",
            )
        )
    settled = {q.settled_at: q.id for q in tree if q.settled_at is not None and q.id != p.id}
    for v in range(0, t.version + 1):
        if v > 0:
            holder = t.pid if v == t.version and t.state == ACQUIRED else None
            who = f" by pid {holder}" if holder else ""
            if by_version.get(v - 1):
                when = f"after the last execute of v{v - 1}"
            elif v == 1:
                when = "with its creation (task.create), or after an execute no longer kept"
            else:
                when = "after an execute no longer kept"
            out.append(
                Event(
                    None,
                    last,
                    t.id,
                    "task",
                    "acquired",
                    f"acquired at v{v}{who}; time not recorded ({when})",
                    v,
                    holder,
                )
            )
        for i, r in enumerate(by_version.get(v, [])):
            if i == 0 and v > 0:
                cause = settled.get(r.created_at)
                why = (
                    f"resumed: {cause} settled at the same instant"
                    if cause is not None
                    else "resumed after a suspend, released, or its lease lapsed"
                )
                out.append(
                    Event(
                        None,
                        max(last, r.created_at),
                        t.id,
                        "task",
                        "left acquired",
                        f"v{v} left acquired ({why}); its time is not recorded, the "
                        "execute below is when it was offered again",
                        v,
                    )
                )
            out += _delivery_events(t.id, r)
            last = max(last, r.created_at)
    if t.state == ACQUIRED and t.expires_at is not None and t.ttl is not None:
        renewed = t.expires_at - t.ttl
        out.append(
            Event(
                renewed,
                max(renewed, last),
                t.id,
                "task",
                "lease renewed",
                f"lease of v{t.version} taken or renewed (acquire or heartbeat) by pid "
                f"{t.pid}; it expires {t.ttl} ms later",
                t.version,
                t.pid,
            )
        )
    elif t.state == SUSPENDED:
        awaiting = [q.id for q in tree if t.id in q.callbacks]
        on = f": awaiting {', '.join(awaiting)}" if awaiting else ""
        out.append(
            Event(
                None,
                max([last, *(q.created_at for q in tree if q.id in awaiting)]),
                t.id,
                "task",
                "suspended",
                f"suspended at v{t.version}{on}; time not recorded",
                t.version,
            )
        )
    elif t.state == HALTED:
        out.append(
            Event(None, last, t.id, "task", "halted", "halted; time not recorded", t.version)
        )
    elif t.state == FULFILLED and p.settled_at is not None:
        out.append(
            Event(
                p.settled_at,
                p.settled_at,
                t.id,
                "task",
                "fulfilled",
                f"task fulfilled at v{t.version} (its promise {p.state})",
                t.version,
            )
        )
    return out


def _delivery_events(task: str, r: OutboxRow) -> list[Event]:
    version = int(getattr(r.message, "version", 0))
    # A pending row is replaced by each re-dispatch: its created_at is the last one.
    again = " (last rewritten: a pending execute is rewritten at each re-dispatch)"
    out = [
        Event(
            r.created_at,
            r.created_at,
            task,
            "delivery",
            "execute",
            f"execute v{version} written for {r.address}{again if r.state == 'pending' else ''}",
            version,
            row=r.id,
            state=str(r.state),
        )
    ]
    if r.state in ("completed", "failed", "outcome_unknown") and r.updated_at:
        word = {"completed": "delivered", "failed": "delivery failed"}.get(
            str(r.state), "delivery outcome unknown"
        )
        code = f"last code {r.last_code}" if r.last_code else ""
        # ``attempts`` counts the sends that did not arrive (a delivery counts none).
        failed = counted(r.attempts, "unsuccessful send")
        attempts = ", ".join(x for x in (failed if r.attempts else "", code) if x)
        out.append(
            Event(
                r.updated_at,
                max(r.updated_at, r.created_at),
                task,
                "delivery",
                word,
                f"execute v{version} {word}" + (f" ({attempts})" if attempts else ""),
                version,
                row=r.id,
                state=str(r.state),
            )
        )
    return out


def _id(r: OutboxRow) -> int:
    return r.id
