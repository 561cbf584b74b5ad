"""``troth explain``: why a workflow is not done, in one line per reason, with evidence.

It walks from the promise asked about down to the leaves that hold it back: a
suspended task's awaited promises (the pending promises of its workflow holding a
callback to it), each explained the same way, until a leaf says what it waits for —
a worker that is not connected, a lease held by a pid, a durable sleep, a client
that must settle an external promise, a delivery that failed for good, a task that
keeps bouncing, a task held by its worker group's concurrency limit.  Pure: it reads
:class:`~troth.ops.facts.Facts` (one store snapshot), a
:class:`~troth.server.workers.ClusterView` (who is connected where) and the bounce
tracker's episodes; the same facts always give the same words.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from troth.flow.limits import rate_text
from troth.ops.facts import DELIVERIES_PER_TASK, Facts, HeldFact
from troth.ops.times import instant, relative, span
from troth.ops.workers import ClusterView
from troth.outbox import codes
from troth.outbox.rows import OutboxRow, RowState
from troth.plural import counted
from troth.protocol.address import nats_subject, parse_poll
from troth.protocol.records import (
    REJECTED,
    REJECTED_CANCELED,
    REJECTED_TIMEDOUT,
    RESOLVED,
    TAG_PARENT,
    Promise,
    Task,
    TaskState,
)

#: Bounces of an episode from which a task counts as bouncing (the backoff's threshold).
BOUNCING: Final = 3
#: How deep the walk goes (a workflow awaiting itself in a cycle stops earlier).
MAX_DEPTH: Final = 64


@dataclass
class Finding:
    """One promise on the way down: what holds it (``reason``, a stable code), the
    line that says so, the evidence as data, and what it awaits in turn."""

    id: str
    state: str
    reason: str
    text: str
    function: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    awaiting: list[Finding] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "state": self.state,
            "reason": self.reason,
            "text": self.text,
            "evidence": self.evidence,
            "awaiting": [f.as_json() for f in self.awaiting],
        }
        if self.function is not None:
            out["function"] = self.function
        return out

    def leaves(self) -> list[Finding]:
        """What finally holds the workflow back (findings that await nothing)."""
        if not self.awaiting:
            return [self]
        return [leaf for f in self.awaiting for leaf in f.leaves()]


@dataclass
class Explanation:
    id: str
    now: int
    done: bool
    root: Finding
    #: The workflow was larger than what was read (the walk may miss a branch).
    cut: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "now": self.now,
            "done": self.done,
            "cut": self.cut,
            "root": self.root.as_json(),
            "blockers": [
                {"id": f.id, "reason": f.reason, "text": f.text} for f in self.root.leaves()
            ]
            if not self.done
            else [],
        }


class Refused(Protocol):
    def describe(self) -> str: ...


class Episode(Protocol):
    """A task's run of bounces, as server/delivery/bounces.py keeps it."""

    @property
    def count(self) -> int: ...
    @property
    def first_at(self) -> int: ...
    @property
    def last_at(self) -> int: ...
    @property
    def due_at(self) -> int: ...
    @property
    def refusal(self) -> Refused | None: ...


Bounces = Callable[[str], Episode | None]


def function_of(p: Promise) -> str | None:
    """The function name an SDK put in the param (base64 JSON ``{"func": …}``)."""
    return function_in(p.param.data)


def function_in(data: str | None) -> str | None:
    """The ``func`` of a param's base64 JSON ``data``, as both SDKs encode a call."""
    if data is None:
        return None
    try:
        decoded = json.loads(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        return None
    func = decoded.get("func") if isinstance(decoded, dict) else None
    return func if isinstance(func, str) else None


def explain(facts: Facts, view: ClusterView, bounces: Bounces, now: int) -> Explanation:
    """The explanation of ``facts.id`` at ``now``."""
    p = facts.promise
    if p is None:
        if facts.schedule is not None:
            s = facts.schedule
            text = (
                f"schedule `{s.id}` ({s.cron}): next run {instant(s.next_run_at, now)}, "
                f"last run {instant(s.last_run_at, now) if s.last_run_at else 'never'}; "
                f"each run creates promise `{s.promise_id}`"
            )
            ev = {
                "cron": s.cron,
                "nextRunAt": s.next_run_at,
                "lastRunAt": s.last_run_at,
                "promiseId": s.promise_id,
            }
            return Explanation(
                facts.id, now, False, Finding(s.id, "schedule", "schedule", text, evidence=ev)
            )
        missing = Finding(facts.id, "missing", "not_found", f"no promise or schedule `{facts.id}`")
        return Explanation(facts.id, now, False, missing)
    walker = _Walker(facts, view, bounces, now)
    root = walker.promise(p, 0, set())
    return Explanation(facts.id, now, not p.pending, root, facts.cut)


class _Walker:
    def __init__(self, facts: Facts, view: ClusterView, bounces: Bounces, now: int) -> None:
        self.facts = facts
        self.view = view
        self.bounces = bounces
        self.now = now

    def promise(self, p: Promise, depth: int, seen: set[str]) -> Finding:
        seen = seen | {p.id}
        f = Finding(p.id, p.state, "", "", function_of(p))
        f.evidence["timeoutAt"] = p.timeout_at
        f.evidence["createdAt"] = p.created_at
        if not p.pending:
            self.settled(p, f)
            return f
        task = self.facts.tasks.get(p.id)
        if task is None:
            self.taskless(p, f)
        else:
            f.evidence["task"] = {
                "state": task.state,
                "version": task.version,
                "pid": task.pid,
                "ttl": task.ttl,
                "expiresAt": task.expires_at,
                "retryAt": task.retry_at,
            }
            self.tasked(p, task, f, depth, seen)
        if p.timeout_at <= self.now:
            f.text += (
                f"; its timeout passed {relative(p.timeout_at, self.now)} (the timer settles it)"
            )
        return f

    # -- settled ------------------------------------------------------------------------

    def settled(self, p: Promise, f: Finding) -> None:
        at = p.settled_at if p.settled_at is not None else p.timeout_at
        f.evidence["settledAt"] = at
        when = instant(at, self.now)
        if p.state == RESOLVED:
            f.reason, f.text = "resolved", f"done: resolved at {when}"
        elif p.state == REJECTED_TIMEDOUT:
            f.reason, f.text = "timed_out", f"timed out at {when}"
        elif p.state == REJECTED_CANCELED:
            f.reason, f.text = "canceled", f"canceled at {when}"
        else:
            assert p.state == REJECTED
            f.reason, f.text = "rejected", f"done: rejected at {when}"

    # -- pending, no task ------------------------------------------------------------

    def taskless(self, p: Promise, f: Finding) -> None:
        until = instant(p.timeout_at, self.now)
        if p.is_timer:
            f.reason, f.text = "sleeping", f"durable sleep until {until}"
        elif p.external:
            waiters = len(p.callbacks) + len(p.listeners)
            f.reason = "awaiting_settlement"
            f.text = (
                f"waits for a client to settle it (resolve, reject or cancel); times out {until}"
            )
            if waiters:
                f.text += f"; {waiters} waiting on it"
        else:
            parent = p.tags.get(TAG_PARENT)
            f.reason = "local"
            f.text = "a local step: it runs inside the task of its workflow" + (
                f" (parent `{parent}`)" if parent else ""
            )
            if parent:
                f.evidence["parent"] = parent

    # -- pending with a task ---------------------------------------------------------

    def tasked(self, p: Promise, t: Task, f: Finding, depth: int, seen: set[str]) -> None:
        if t.state == TaskState.SUSPENDED:
            self.suspended(p, t, f, depth, seen)
        elif t.state == TaskState.ACQUIRED:
            self.acquired(t, f)
        elif t.state == TaskState.PENDING:
            self.pending_task(t, f)
        elif t.state == TaskState.HALTED:
            f.reason = "halted"
            f.text = f"task halted: nothing runs it until `troth tasks continue {t.id}`"
        else:
            f.reason = "task_fulfilled"
            f.text = "task fulfilled, its promise not yet settled"

    def suspended(self, p: Promise, t: Task, f: Finding, depth: int, seen: set[str]) -> None:
        awaited = sorted(
            (q for q in self.facts.promises.values() if q.pending and t.id in q.callbacks),
            key=lambda q: q.id,
        )
        f.reason = "awaiting"
        f.evidence["awaiting"] = [q.id for q in awaited]
        if not awaited:
            f.text = (
                "task suspended, awaiting promises outside this workflow "
                "(none of its promises holds a callback to it)"
            )
            return
        names = ", ".join(f"`{q.id}`" for q in awaited[:5])
        more = f" and {len(awaited) - 5} more" if len(awaited) > 5 else ""
        f.text = f"task suspended, awaiting {names}{more}"
        if depth >= MAX_DEPTH:
            f.text += " (walk stopped: too deep)"
            return
        for q in awaited:
            if q.id in seen:
                f.awaiting.append(Finding(q.id, q.state, "cycle", "awaits a promise above it"))
            else:
                f.awaiting.append(self.promise(q, depth + 1, seen))

    def acquired(self, t: Task, f: Finding) -> None:
        f.reason = "held"
        where = ""
        if t.pid is not None:
            held = self.view.holding(t.pid)
            if held:
                nodes = sorted({c.node for c in held})
                where = f" on node {', '.join(f'`{n}`' for n in nodes)}"
                f.evidence["nodes"] = nodes
            else:
                where = " (not connected to any node now)"
        text = f"task held by pid `{t.pid}`{where}"
        if t.expires_at is not None:
            left = t.expires_at - self.now
            if left >= 0:
                text += f", lease expires in {span(left)}"
            else:
                text += f", lease expired {span(-left)} ago (the timer takes it back)"
            if t.ttl is not None:
                beat = t.expires_at - t.ttl
                text += f", last heartbeat {relative(beat, self.now)}"
                f.evidence["lastHeartbeatAt"] = beat
        f.text = text

    def pending_task(self, t: Task, f: Finding) -> None:
        executes = self.facts.deliveries.get(t.id, [])
        f.evidence["executes"] = [row_json(r) for r in executes[:10]]
        held = self.facts.held.get(t.id)
        if held is not None:
            self.held_by_limit(held, f)
            return
        if not executes:
            f.reason = "no_execute"
            f.text = "task pending; no execute was written for it (its promise has no target)"
            return
        latest = executes[0]
        head = f"task pending for {span(max(self.now - latest.created_at, 0))}"
        address = latest.address
        more = len(executes) == DELIVERIES_PER_TASK
        tries = sum(r.attempts + (r.state == RowState.COMPLETED) for r in executes)
        sent = (
            f"{counted(len(executes), 'execute', at_least=more)} to `{address}`"
            f" ({counted(tries, 'send', at_least=more)})"
        )
        finished = [
            r
            for r in executes
            if r.state in (RowState.COMPLETED, RowState.FAILED) and r.last_code != codes.SUPERSEDED
        ]
        delivered = any(r.state == RowState.COMPLETED for r in finished)
        if finished and finished[0].state == RowState.FAILED:
            if finished[0].last_code == codes.NATS_OFF:
                self.nats_off(finished[0], t, f, head, sent)
                return
            f.reason = "delivery_failed"
            f.text = (
                f"{head}; {sent}; delivery failed permanently "
                f"({outcome(finished[0])} from {finished[0].address})"
            )
            return
        episode = self.bounces(t.id)
        if episode is not None and episode.count >= BOUNCING:
            f.reason = "bouncing"
            window = span(max(episode.last_at - episode.first_at, 0))
            f.text = f"{head}; task bounced {episode.count}x in {window} without progress"
            if episode.refusal is not None:
                f.text += f"; last refusal: {episode.refusal.describe()}"
            if episode.due_at > self.now:
                f.text += f"; next execute held until {instant(episode.due_at, self.now)}"
            f.evidence["bounces"] = episode.count
            return
        retry = f"; next execute {relative(t.retry_at, self.now)}" if t.retry_at is not None else ""
        subject = nats_subject(address)
        if subject is not None:
            self.nats(latest, subject, f, head, sent, delivered, retry)
            return
        poll = parse_poll(address)
        if poll is None:
            f.reason = "delivering"
            f.text = f"{head}; {sent}, last outcome: {outcome(latest)}{retry}"
            return
        group = poll.group
        workers = self.view.connected(group, poll.id if poll.cast == "uni" else None)
        f.evidence["group"] = group
        f.evidence["workers"] = len(workers)
        if not workers:
            seen_at = self.view.last_seen.get(group)
            if seen_at is not None:
                ago = f"last seen {relative(seen_at, self.now)}"
            elif self.view.remembers_since is not None:
                started = relative(self.view.remembers_since, self.now)
                ago = f"none since this server started {started}"
            else:
                ago = "never seen"
            who = (
                f"worker `{poll.id}` in group"
                if poll.cast == "uni"
                else "worker connected to group"
            )
            undelivered = "none delivered" if not delivered else "the last ones undelivered"
            f.reason = "no_worker"
            f.text = f"{head}; {sent}, {undelivered}: no {who} `{group}` ({ago}){retry}"
            return
        f.reason = "delivering"
        f.text = f"{head}; {sent}; {counted(len(workers), 'worker')} of `{group}` connected"
        if latest.state == RowState.COMPLETED:
            f.text += f"; the last execute was delivered {relative(latest.updated_at, self.now)}"
            f.text += " and no worker acquired it"
        else:
            f.text += f"; last outcome: {outcome(latest)}"
        f.text += retry

    def held_by_limit(self, held: HeldFact, f: Finding) -> None:
        """A pending task queued for a slot of its group (troth/flow): no ``execute``
        goes to it until a slot frees and the tasks before it have theirs."""
        f.reason = "held_by_limit"
        ahead = counted(held.ahead, "task")
        full = held.concurrency is not None and held.in_use >= held.concurrency
        if held.per_key is not None and not full and held.key_in_use >= held.per_key:
            f.text = (
                f"held by the per-key limit of group `{held.group}`: key `{held.key}` has "
                f"{held.key_in_use:,} of {held.per_key:,} in use, {ahead} ahead"
            )
        elif held.concurrency is not None and (held.rate is None or full):
            f.text = (
                f"held by the concurrency limit of group `{held.group}`: "
                f"{held.in_use:,} of {held.concurrency:,} in use, {ahead} ahead"
            )
        else:
            f.text = (
                f"held by the rate limit of group `{held.group}`: "
                f"{rate_text(held.rate or 0.0)}, {ahead} ahead"
            )
        if held.priority:
            f.text += f" (its troth:priority {held.priority})"
        f.evidence["group"] = held.group
        f.evidence["limit"] = {
            "concurrency": held.concurrency,
            "inUse": held.in_use,
            "ahead": held.ahead,
            "priority": held.priority,
        }
        if held.rate is not None:
            f.evidence["limit"]["rate"] = held.rate
        if held.per_key is not None:
            f.evidence["limit"]["perKey"] = held.per_key
            f.evidence["limit"]["key"] = held.key
            f.evidence["limit"]["keyInUse"] = held.key_in_use

    # -- nats:// ---------------------------------------------------------------------

    def nats(
        self,
        latest: OutboxRow,
        subject: str,
        f: Finding,
        head: str,
        sent: str,
        delivered: bool,
        retry: str,
    ) -> None:
        """A task whose executes go to a NATS subject.  NATS keeps no list of who
        subscribes, so what troth knows is what its last publish met: "no responders"
        (nobody subscribed), no connection, or a subscriber that took it."""
        f.evidence["subject"] = subject
        f.evidence["nats"] = self.view.nats
        code = latest.last_code
        attempt = (
            f"last attempt {relative(latest.updated_at, self.now)}: {outcome(latest)}"
            if code is not None
            else ""
        )
        undelivered = "none delivered" if not delivered else "the last ones undelivered"
        if code == codes.NATS_NO_RESPONDERS:
            f.reason = "no_worker"
            f.text = (
                f"{head}; {sent}, {undelivered}: no worker subscribed to nats subject "
                f"`{subject}` (last attempt {relative(latest.updated_at, self.now)}: "
                f"no responders){retry}"
            )
        elif self.view.nats == "off" and latest.state != RowState.COMPLETED:
            f.reason = "undeliverable"
            f.text = (
                f"{head}; {sent}: undeliverable by this node, which has no NATS "
                f"(no nats_url); only a node with nats_url can publish to `{subject}`{retry}"
            )
        elif code == codes.NATS_DISCONNECTED or (
            self.view.nats == "disconnected" and latest.state != RowState.COMPLETED
        ):
            f.reason = "nats_disconnected"
            f.text = (
                f"{head}; {sent}, {undelivered}: troth is not connected to NATS, so nothing "
                f"reaches nats subject `{subject}`" + (f" ({attempt})" if attempt else "") + retry
            )
        elif latest.state == RowState.COMPLETED:
            f.reason = "delivering"
            f.text = (
                f"{head}; {sent}; the last execute was published to nats subject `{subject}` "
                f"{relative(latest.updated_at, self.now)}, where a subscriber took it, "
                f"and no worker acquired it{retry}"
            )
        else:
            f.reason = "delivering"
            f.text = f"{head}; {sent} (nats subject `{subject}`), last outcome: {outcome(latest)}"
            f.text += retry

    def nats_off(self, row: OutboxRow, t: Task, f: Finding, head: str, sent: str) -> None:
        """A ``nats://`` execute failed for good: the node that took it has no NATS.
        The retry timer re-emits the execute; a node with ``nats_url`` delivers it."""
        subject = nats_subject(row.address) or row.address
        f.reason = "undeliverable"
        f.evidence["subject"] = subject
        f.evidence["nats"] = self.view.nats
        f.text = (
            f"{head}; {sent}; undeliverable: NATS is not configured (no nats_url) on the node "
            f"that took it, so nothing was published to nats subject `{subject}` "
            f"(failed {relative(row.updated_at, self.now)})"
        )
        if t.retry_at is not None:
            f.text += (
                f"; the next execute {relative(t.retry_at, self.now)} is delivered only "
                "by a node with nats_url"
            )


def outcome(row: OutboxRow) -> str:
    """A row's last delivery outcome in words (the stable code kept beside it)."""
    code = row.last_code
    if code is None:
        return {
            RowState.COMPLETED: "delivered",
            RowState.PENDING: "not sent yet",
            RowState.DISPATCHING: "being sent",
        }.get(RowState(row.state), str(row.state))
    if code.startswith(codes.HTTP_STATUS):
        return f"HTTP {code[len(codes.HTTP_STATUS) :]}"
    words = {
        codes.NO_CONNECTION: "no worker connected",
        codes.CONNECTION_LOST: "worker connection lost while sending",
        codes.BAD_ADDRESS: "unsupported address",
        codes.HTTP_REFUSED: "connection refused",
        codes.HTTP_ERROR: "HTTP error",
        codes.ATTEMPTS_EXHAUSTED: "attempts exhausted",
        codes.SEND_TIMEOUT: "send timed out",
        codes.SUPERSEDED: "superseded by a newer execute",
        codes.NATS_DISCONNECTED: "not connected to NATS",
        codes.NATS_NO_RESPONDERS: "no NATS subscriber on the subject",
        codes.NATS_FLUSH_FAILED: "NATS flush failed after publishing",
        codes.NATS_TOO_LARGE: "larger than the NATS max_payload",
        codes.NATS_OFF: "nats:// address but this node has no nats_url",
    }
    return words.get(code, code)


def row_json(r: OutboxRow) -> dict[str, Any]:
    """An outbox row as the operator API shows it."""
    m = r.message
    out: dict[str, Any] = {
        "id": r.id,
        "address": r.address,
        "kind": "execute" if hasattr(m, "task_id") else "unblock",
        "state": str(r.state),
        "attempts": r.attempts,
        "createdAt": r.created_at,
        "availableAt": r.available_at,
        "updatedAt": r.updated_at,
        "lastCode": r.last_code,
        "claimedBy": r.claimed_by,
    }
    task_id = getattr(m, "task_id", None)
    if task_id is not None:
        out["taskId"] = task_id
        out["version"] = getattr(m, "version", None)
    else:
        promise = getattr(m, "promise", None)
        out["promiseId"] = getattr(promise, "id", None)
    return out
