"""Internal steps r1 r3 r4 r5 r6 r7 (SPEC.md §5) and the two ways they are fired.

Each step re-checks its own guard and is a silent no-op when not enabled, so firing
one early or twice is harmless ("an armed deadline means *not before*").

* :func:`settle_enabled` fires, inside a request's transaction, every step that the
  request's writes enabled (README of the reference: firing every enabled step at
  once is one legal schedule, and it gives seed 004's behaviour).
* :func:`fire_due` is the timer's unit of work: every step whose deadline is due.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from msgspec.structs import replace

from troth.machine.calendar import next_after, occurrences, parse_cron
from troth.machine.state import (
    ACQUIRED,
    HALTED,
    SUSPENDED,
    TASK_PENDING,
    new_promise,
    read_promise,
    read_task,
    to_pending,
)
from troth.machine.tx import Tx
from troth.protocol.records import (
    EARLIEST,
    PENDING,
    TAG_PARENT,
    TAG_SCHEDULE,
    TAG_TARGET,
    Execute,
    Message,
    Promise,
    Schedule,
    Tags,
    Task,
    Unblock,
)

#: Occurrences created by one r7 firing; the rest are caught up by the next firing,
#: which is due at once (bounded work per firing, SPEC.md §7 P6).
SCHEDULE_BATCH = 1000

#: Ids of each kind the timer takes per pass.
DUE_BATCH = 1000


@dataclass(frozen=True)
class Config:
    """What the machine needs to know of the server's configuration."""

    retry_timeout: int = 5000

    def __post_init__(self) -> None:
        if self.retry_timeout <= 0:
            raise ValueError("retry_timeout must be > 0 (well_formed_config_retry_positive)")


@dataclass
class Recorder:
    """A :class:`Tx` wrapper that remembers which promises and tasks were written,
    so that the steps those writes enabled can be fired in the same transaction."""

    tx: Tx
    promises: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    messages: int = 0

    def get_promise(self, id: str) -> Promise | None:
        return self.tx.get_promise(id)

    def get_task(self, id: str) -> Task | None:
        return self.tx.get_task(id)

    def get_schedule(self, id: str) -> Schedule | None:
        return self.tx.get_schedule(id)

    def set_promise(self, promise: Promise) -> None:
        self.tx.set_promise(promise)
        self.promises.append(promise.id)

    def set_task(self, task: Task) -> None:
        self.tx.set_task(task)
        self.tasks.append(task.id)

    def set_schedule(self, schedule: Schedule) -> None:
        self.tx.set_schedule(schedule)

    def del_schedule(self, id: str) -> None:
        self.tx.del_schedule(id)

    def set_message(self, address: str, message: Message) -> None:
        self.tx.set_message(address, message)
        self.messages += 1

    def scan_promises(
        self, states: Collection[str] | None, tags: Tags, after: str | None, limit: int
    ) -> list[Promise]:
        return self.tx.scan_promises(states, tags, after, limit)

    def scan_tasks(
        self, states: Collection[str] | None, after: str | None, limit: int
    ) -> list[Task]:
        return self.tx.scan_tasks(states, after, limit)

    def scan_schedules(self, tags: Tags, after: str | None, limit: int) -> list[Schedule]:
        return self.tx.scan_schedules(tags, after, limit)

    def promises_in_branch(self, branch: str, limit: int) -> list[Promise]:
        return self.tx.promises_in_branch(branch, limit)

    def due_promises(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        return self.tx.due_promises(now, limit, since)

    def due_tasks(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        return self.tx.due_tasks(now, limit, since)

    def due_schedules(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        return self.tx.due_schedules(now, limit, since)

    def undrained_promises(self, limit: int) -> list[str]:
        return self.tx.undrained_promises(limit)

    def next_deadline(self) -> int | None:
        return self.tx.next_deadline()


# --------------------------------------------------------------------------- steps


def r1_promise_timeout(tx: Tx, id: str, now: int) -> None:
    """Persist Fact P for a pending promise past its deadline; fulfils its task."""
    read_promise(tx, id, now, touch=True)


def r3_listener(tx: Tx, id: str, address: str, now: int) -> None:
    """Drain one listener of a settled promise into an ``unblock`` message."""
    p = read_promise(tx, id, now, touch=True)
    if p is None or p.state == PENDING or address not in p.listeners:
        return
    p = replace(p, listeners=tuple(a for a in p.listeners if a != address))
    tx.set_promise(p)
    tx.set_message(address, Unblock(p.record()))


def r4_callback(tx: Tx, id: str, awaiter: str, now: int) -> None:
    """Drain one callback of a settled promise and resume its awaiter."""
    p = read_promise(tx, id, now, touch=True)
    if p is None or p.state == PENDING or awaiter not in p.callbacks:
        return
    tx.set_promise(replace(p, callbacks=tuple(x for x in p.callbacks if x != awaiter)))
    resume_one(tx, id, awaiter, now)


def resume_one(tx: Tx, awaited: str, awaiter: str, now: int) -> None:
    """Wake or buffer the awaiter; a logically dead awaiter is dropped (C6)."""
    r = read_task(tx, awaiter, now, touch=True)
    if r is None or r.promise is None:
        return
    t = r.task
    if t.state == SUSPENDED:
        tx.set_task(replace(t, state=TASK_PENDING, resumes=(awaited,), retry_at=now))
    elif t.state in (TASK_PENDING, ACQUIRED, HALTED):
        if awaited not in t.resumes:
            tx.set_task(replace(t, resumes=(*t.resumes, awaited)))


def r5_lease_timeout(tx: Tx, id: str, now: int) -> None:
    """An acquired task whose lease ran out goes back to pending (promise only viewed)."""
    t = tx.get_task(id)
    if t is None or t.state != ACQUIRED or t.expires_at is None or t.expires_at > now:
        return
    p = read_promise(tx, id, now)
    if p is None or p.state != PENDING:
        return
    tx.set_task(to_pending(t, now))


def r6_retry_timeout(tx: Tx, id: str, now: int, config: Config) -> None:
    """A pending task due for dispatch: re-arm and send ``execute`` to its target."""
    t = tx.get_task(id)
    if t is None or t.state != TASK_PENDING or t.retry_at is None or t.retry_at > now:
        return
    p = read_promise(tx, id, now)
    if p is None or p.state != PENDING:
        return
    tx.set_task(replace(t, retry_at=now + config.retry_timeout))
    tx.set_message(p.tags.get(TAG_TARGET, ""), Execute(task_id=t.id, version=t.version))


def occurrence_id(schedule: Schedule, t: int) -> str:
    """``expand``: the template with ``{{.id}}`` and ``{{.timestamp}}`` filled in, in the
    reserved ``~{scheduleId}/`` namespace, so a client can never pre-create it and two
    schedules never share an id (SPEC.md §5.3)."""
    expanded = schedule.promise_id.replace("{{.id}}", schedule.id).replace("{{.timestamp}}", str(t))
    return f"~{schedule.id}/{expanded}"


def r7_schedule(tx: Tx, id: str, now: int) -> None:
    """Catch up every missed occurrence, each created at its own instant."""
    s = tx.get_schedule(id)
    if s is None or s.next_run_at > now:
        return
    cron = parse_cron(s.cron)
    times = occurrences(cron, s.next_run_at, now, limit=SCHEDULE_BATCH)
    if not times:
        return
    for t in times:
        pid = occurrence_id(s, t)
        if tx.get_promise(pid) is None:
            tags = {
                "resonate:origin": pid,
                "resonate:branch": pid,
                TAG_PARENT: pid,
                **s.promise_tags,
                TAG_SCHEDULE: s.id,
            }
            new_promise(tx, pid, t + s.promise_timeout, s.promise_param, tags, t)
    last = times[-1]
    tx.set_schedule(replace(s, last_run_at=last, next_run_at=next_after(cron, last)))


# ------------------------------------------------------------------------- drivers


def fire_promise_steps(tx: Tx, id: str, now: int) -> None:
    """Every step enabled on one promise: r1, then r3 for each listener, r4 for each
    callback (each re-reads, so the order of the ledgers is kept)."""
    p = tx.get_promise(id)
    if p is None:
        return
    if p.state == PENDING and p.timeout_at <= now:
        r1_promise_timeout(tx, id, now)
        p = tx.get_promise(id)
        assert p is not None
    if p.state == PENDING:
        return
    for address in p.listeners:
        r3_listener(tx, id, address, now)
    for awaiter in p.callbacks:
        r4_callback(tx, id, awaiter, now)


def fire_task_steps(tx: Tx, id: str, now: int, config: Config) -> None:
    """Every step enabled on one task: r5 lease expiry, then r6 dispatch.

    A due task whose promise is logically dead gets r1 on its promise instead (that
    fulfils it), so a dead task's deadline never stays due.
    """
    t = tx.get_task(id)
    if t is None:
        return
    due = (t.state == ACQUIRED and t.expires_at is not None and t.expires_at <= now) or (
        t.state == TASK_PENDING and t.retry_at is not None and t.retry_at <= now
    )
    if not due:
        return
    p = read_promise(tx, id, now)
    if p is not None and p.state != PENDING:
        fire_promise_steps(tx, id, now)
        return
    r5_lease_timeout(tx, id, now)
    r6_retry_timeout(tx, id, now, config)


def settle_enabled(rec: Recorder, now: int, config: Config) -> None:
    """Fire, until quiescent, every step enabled on the objects this transaction wrote."""
    p_done = 0
    t_done = 0
    while p_done < len(rec.promises) or t_done < len(rec.tasks):
        while p_done < len(rec.promises):
            fire_promise_steps(rec, rec.promises[p_done], now)
            p_done += 1
        while t_done < len(rec.tasks):
            fire_task_steps(rec, rec.tasks[t_done], now, config)
            t_done += 1


def fire_due(rec: Recorder, now: int, config: Config, since: int = EARLIEST) -> int:
    """The timer's unit of work: fire every step due at ``now``, from ``since`` (no live
    deadline lies before it: ``Tx.due_promises``); returns the count of objects
    visited (0 means nothing was due)."""
    visited = 0
    for id in rec.due_promises(now, DUE_BATCH, since):
        fire_promise_steps(rec, id, now)
        visited += 1
    for id in rec.undrained_promises(DUE_BATCH):
        fire_promise_steps(rec, id, now)
        visited += 1
    for id in rec.due_tasks(now, DUE_BATCH, since):
        fire_task_steps(rec, id, now, config)
        visited += 1
    for id in rec.due_schedules(now, DUE_BATCH, since):
        r7_schedule(rec, id, now)
        visited += 1
    settle_enabled(rec, now, config)
    return visited
