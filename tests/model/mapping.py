"""troth onto the model: its store in the model's shape, and a step-by-step comparison.

* :func:`from_snap` maps ``debug.snap`` (promises with ledgers, tasks with deadlines and
  resumes, schedules, outbox rows) to a :class:`~model.machine.State`, so the property
  catalogue runs against troth's real stores.  troth keeps every outbox row (delivered
  ones too, and a newer message for a key may sit beside an older claimed row); the
  model's outbox is a keyed upsert, so per key the latest row (highest id) is the entry.
* :class:`Troth` drives a real troth in-process: ``build_app`` with the memory, SQLite or
  PostgreSQL store, started on its own event loop thread, called through httpx's ASGI
  transport — the whole HTTP app (envelope decoding, engine, writer thread, store) without a
  socket, because a socket costs about three times as much per call.
* :class:`Differential` runs one script against troth and the model side by side and,
  after every step, checks that the responses are equal, that the stores are equal,
  and that all 95 catalogue properties hold of troth's states (see ``check``).
* :func:`replay` runs a script; failing scripts print themselves in that form.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import pprint
import tempfile
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import httpx

from helpers import pg
from helpers.pgbouncer import pgbouncer
from model import machine as m
from model.properties import (
    internal_failures,
    state_failures,
    trans_failures_with_findings,
)
from troth.server.config import Settings
from troth.server.run import build_app

Json = dict[str, Any]
Op = tuple[str, Any]  # (request kind, data) | ("advance", ms) | ("tick", None)
#                        | ("limit", {"group", "concurrency", "perKey", "rate", "burst"})

START = 1000  # the clock of a fresh script (ms)

#: Transition properties that hold of each machine step but not of troth's
#: transaction when that is a request *followed by* the internal steps it enabled (or,
#: for ``debug.tick``, several internal steps at one instant).  Composition legitimately
#: breaks them; they are skipped on troth's pair only when the model's chain has more
#: than one step, and each is still checked on every single step of that chain, whose
#: two ends are troth's states (``Differential.check``).
COMPOSITE_EXEMPT = {
    # entering pending sets retryAt = now, and r6 in the same transaction re-arms it
    # to now + retryTimeout (release, continue, lease expiry, a wake)
    "consistent_task_pending_entry_arms_retry",
    # a woken task has retryAt = now until r6 dispatches it in the same transaction
    "consistent_task_wake_records_resume",
    # a schedule occurrence born live at its instant t, then timed out by r1 in the
    # same tick, is neither of the two birth shapes seen from the tick's pair
    "consistent_new_promise_born_clean",
}

#: And when a request's chain includes r5: a lease granted with ``ttl = 0`` (a known
#: gap, accepted) expires in the transaction that granted it, so troth's pair shows the
#: task going pending → pending with version + 1, a re-armed retryAt and its resumes
#: cleared, or born pending at version 1 (task.create).
EXPIRED_AT_GRANT_EXEMPT = {
    "consistent_task_birth_couples_promise_birth",
    "monotone_task_version_increases_only_on_acquisition",
    "consistent_task_retry_rearm_only_when_due",
    "consistent_task_resumes_cleared_only_on_dispatch_or_park",
}

#: Properties of the specification that troth's flow control (an extension beyond it,
#: docs/operations.md "Flow control") breaks by design, skipped only while a limit is
#: set: on troth's pair, and on the model's ``("gate",)`` step.
FLOW_EXEMPT = {
    # a held task's execute, written and not yet sent, is withdrawn from the outbox
    "monotone_outbox_keys_never_disappear",
    # under a rate limit, the first held task's retryAt moves to when its token comes
    "consistent_task_retry_rearm_only_when_due",
}

# ---------------------------------------------------------------------- the snapshot


def promise_of(d: Json) -> m.Promise:
    return m.Promise(
        id=d["id"],
        state=d["state"],
        param=m.Value.of(d.get("param")),
        value=m.Value.of(d.get("value")),
        tags=dict(d.get("tags") or {}),
        timeout_at=d["timeoutAt"],
        created_at=d["createdAt"],
        settled_at=d.get("settledAt"),
        callbacks=tuple(d.get("callbacks") or ()),
        listeners=tuple(d.get("listeners") or ()),
    )


def task_of(d: Json) -> m.Task:
    return m.Task(
        id=d["id"],
        state=d["state"],
        version=d["version"],
        ttl=d.get("ttl"),
        pid=d.get("pid"),
        expires_at=d.get("expiresAt"),
        retry_at=d.get("retryAt"),
        resumes=tuple(d.get("resumes") or ()),
    )


def schedule_of(d: Json) -> m.Schedule:
    return m.Schedule(
        id=d["id"],
        cron=d["cron"],
        promise_id=d["promiseId"],
        promise_timeout=d["promiseTimeout"],
        promise_param=m.Value.of(d.get("promiseParam")),
        promise_tags=dict(d.get("promiseTags") or {}),
        created_at=d["createdAt"],
        next_run_at=d["nextRunAt"],
        last_run_at=d.get("lastRunAt"),
    )


def message_of(d: Json) -> m.Message:
    if d["kind"] == "execute":
        return m.Execute(d["taskId"], d["version"])
    return m.Unblock(promise_of(d["promise"]))


def from_snap(snap: Json) -> m.State:
    """troth's ``debug.snap`` in the model's shape (outbox: the latest row per key)."""
    latest: dict[str, Json] = {}
    for row in sorted(snap["outbox"], key=lambda r: r["id"]):
        latest[row["key"]] = row
    outbox = []
    for key, row in latest.items():
        entry = m.Entry(row["address"], message_of(row["message"]))
        assert entry.key == key, (entry.key, row)
        outbox.append(entry)
    return m.State(
        promises=tuple(promise_of(p) for p in snap["promises"]),
        tasks=tuple(task_of(t) for t in snap["tasks"]),
        schedules=tuple(schedule_of(c) for c in snap["schedules"]),
        outbox=tuple(outbox),
    )


def unordered_resumes(tasks: Iterable[m.Task]) -> list[m.Task]:
    """Tasks with ``resumes`` sorted: two awaited promises settling in one transaction
    are drained in an order the specification leaves open (internal steps fire in any
    order, latitude L7), and the order is invisible on the wire (a count)."""
    return [replace(t, resumes=tuple(sorted(t.resumes))) for t in tasks]


def state_diff(model: m.State, troth: m.State) -> list[str]:
    """Every row that differs, by id / key (row order is not part of the state, nor is
    the order of a task's ``resumes``)."""
    out: list[str] = []
    tables: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("promise", {p.id: p for p in model.promises}, {p.id: p for p in troth.promises}),
        (
            "task",
            {t.id: t for t in unordered_resumes(model.tasks)},
            {t.id: t for t in unordered_resumes(troth.tasks)},
        ),
        ("schedule", {c.id: c for c in model.schedules}, {c.id: c for c in troth.schedules}),
        ("outbox", {e.key: e for e in model.outbox}, {e.key: e for e in troth.outbox}),
    ]
    for name, a, b in tables:
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                out.append(f"{name} {k!r}:\n    model: {a.get(k)}\n    troth: {b.get(k)}")
    return out


# ---------------------------------------------------------------------- troth in-process


class Troth:
    """A real troth app (debug mode) on its own event loop thread, driven over ASGI.

    PostgreSQL runs on a throwaway database of its own (``tests/helpers/pg.py``),
    created here and dropped by :meth:`close`; ``debug.reset`` empties it (a TRUNCATE)
    between scripts.
    """

    def __init__(self, store: str) -> None:
        self.store = store
        # "postgres-transaction": PostgreSQL through PgBouncer in transaction mode.
        backend, _, pool_mode = store.partition("-")
        self.dir = tempfile.TemporaryDirectory(prefix="troth-diff-")
        self.database = pg.create_database("troth_diff") if backend == "postgres" else None
        self.pooler = contextlib.ExitStack()
        url = self.database or ""
        if pool_mode:
            url = self.pooler.enter_context(pgbouncer(pool_mode)).url(url)
        settings = Settings(
            store=backend,
            db=str(Path(self.dir.name) / "troth.db"),
            postgres_url=url,
            postgres_pool_mode=pool_mode or "session",
            debug=True,
            access_log=False,
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        try:
            self.app = build_app(settings)
            self._run(self.app.startup())
        except BaseException:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.dir.cleanup()
            self.pooler.close()
            if self.database is not None:
                pg.drop_database(self.database)
            raise
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://troth"
        )
        self.corr = itertools.count(1)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def call(self, kind: str, data: Any, now: int | None = None) -> tuple[int, Any]:
        head: Json = {"corrId": f"d-{next(self.corr)}", "version": m.PROTOCOL_VERSION}
        if now is not None:
            head["resonate:debug_time"] = now
        envelope = {"kind": kind, "head": head, "data": data}
        reply = self._run(self.client.post("/", json=envelope))
        body = reply.json()
        assert body["kind"] == kind and body["head"]["corrId"] == head["corrId"], body
        assert reply.status_code == body["head"]["status"], (reply.status_code, body)
        return body["head"]["status"], body["data"]

    def ok(self, kind: str, data: Any, now: int | None = None) -> Any:
        status, body = self.call(kind, data, now)
        assert status == 200, (kind, status, body)
        return body

    def reset(self) -> None:
        self.ok("debug.reset", {})
        self.ok("debug.start", {})  # pause the timer and delivery: deadlines fire on tick

    def tick(self, now: int) -> None:
        self.ok("debug.tick", {"time": now}, now)

    def snap(self) -> m.State:
        return from_snap(self.ok("debug.snap", {}))

    def set_limit(self, body: Json) -> None:
        """``POST /ops/limits/set`` (the operator API; no auth in these tests)."""
        reply = self._run(self.client.post("/ops/limits/set", json=body))
        assert reply.status_code == 200, (body, reply.status_code, reply.text)

    def limits(self) -> dict[str, tuple[int, int]]:
        """``GET /ops/limits``: each group's slots in use and tasks held."""
        reply = self._run(self.client.get("/ops/limits"))
        assert reply.status_code == 200, reply.text
        return {x["group"]: (x["inUse"], x["held"]) for x in reply.json()["limits"]}

    def close(self) -> None:
        try:
            self._run(self.client.aclose())
            self._run(self.app.shutdown())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.dir.cleanup()
        finally:
            self.pooler.close()
            if self.database is not None:
                pg.drop_database(self.database)


_troths: dict[str, Troth] = {}

#: What the scripts exercised in this process: ``(kind, status)`` per request and one
#: count per internal step the model fired (read by test_differential's coverage check).
STATS: Counter[tuple[str, Any]] = Counter()


def troth_for(store: str) -> Troth:
    """One troth per backend per process (reset before every script)."""
    if store not in _troths:
        _troths[store] = Troth(store)
    return _troths[store]


@atexit.register
def _close_all() -> None:
    for t in _troths.values():
        try:
            t.close()
        except Exception:  # pragma: no cover - best effort at interpreter exit
            pass
    _troths.clear()


# ---------------------------------------------------------------------- the comparison


class Divergence(AssertionError):
    """troth and the model disagree, or a property failed; the message has the script."""


def script_text(store: str, ops: Iterable[Op]) -> str:
    body = pprint.pformat(list(ops), width=96, sort_dicts=False)
    return f"replay({store!r}, {body})"


def normalise(kind: str, status: int, data: Any) -> Any:
    """troth's answer in the model's terms: refusals carry a message string (the model
    has none); a fence's inner head also carries corrId/version (not compared)."""
    if status not in (200, 300):
        assert isinstance(data, str) and data, (kind, status, data)
        return None
    if kind == "task.fence" and isinstance(data, dict) and "action" in data:
        action = dict(data["action"])
        inner = action["head"]["status"]
        action["head"] = {"status": inner}
        if inner not in (200, 300):
            assert isinstance(action["data"], str), action
            action["data"] = None
        data = {**data, "action": action}
    return data


class Differential:
    """One script, run on troth and on the model, compared after every step."""

    def __init__(self, troth: Troth, start: int = START) -> None:
        self.troth = troth
        troth.reset()
        self.now = start
        self.model = m.State()
        self.ops: list[Op] = []
        self.steps = 0

    def fail(self, message: str) -> NoReturn:
        script = script_text(self.troth.store, self.ops)
        raise Divergence(f"{message}\n\nat now={self.now}; replayable script:\n{script}")

    def run(self, op: Op) -> None:
        kind, arg = op
        if kind == "advance":
            self.advance(arg)
        elif kind == "tick":
            self.tick()
        elif kind == "limit":
            self.limit(arg)
        else:
            self.request(kind, arg)

    # -- the three kinds of step ------------------------------------------------------

    def request(self, kind: str, data: Json) -> None:
        self.ops.append((kind, data))
        if kind.endswith(".search"):
            self.search(kind, data)
            return
        before = self.model
        response, chain = m.after_request(before, kind, data, self.now)
        status, body = self.troth.call(kind, data, self.now)
        got = normalise(kind, status, body)
        STATS[kind, status] += 1
        if kind == "task.fence" and status == 200 and isinstance(body, dict):
            STATS["fence." + body["action"]["kind"], body["action"]["head"]["status"]] += 1
        if (status, got) != (response.status, response.data):
            self.fail(
                f"{kind} {data}: response differs\n"
                f"  model: {response.status} {response.data}\n"
                f"  troth: {status} {got}"
            )
        self.check(before, chain, internal=False)

    def search(self, kind: str, data: Json) -> None:
        """Every page, following each side's own cursor (troth's is opaque)."""
        ours, theirs = dict(data), dict(data)
        for _ in range(100):
            response, _chain = m.handle(self.model, kind, ours, self.now)
            status, body = self.troth.call(kind, theirs, self.now)
            got = normalise(kind, status, body)
            STATS[kind, status] += 1
            expected = response.data
            if status == response.status == 200:
                assert got is not None and expected is not None
                got, expected = dict(got), dict(expected)
                their_cursor, our_cursor = got.pop("cursor", None), expected.pop("cursor", None)
                got["more"], expected["more"] = their_cursor is not None, our_cursor is not None
            if (status, got) != (response.status, expected):
                self.fail(
                    f"{kind} {ours}: page differs\n  model: {response.status} {expected}\n"
                    f"  troth: {status} {got}"
                )
            if status != 200 or not got or not got["more"]:
                break
            ours["cursor"], theirs["cursor"] = our_cursor, their_cursor
        self.check(self.model, [], internal=False)

    def limit(self, body: Json) -> None:
        """An operator sets a concurrency limit (troth's flow control): nothing else
        changes, on either side, until a job runs."""
        self.ops.append(("limit", body))
        self.troth.set_limit(body)
        limit = m.Limit(
            body["group"],
            body.get("concurrency"),
            body.get("perKey"),
            body.get("rate"),
            body.get("burst") or 1,
        )
        before = self.model
        self.model = m.set_limit(before, limit)
        self.check(self.model, [], internal=False)

    def advance(self, dt: int) -> None:
        """The clock moves and nothing fires (the specification's ``idle`` step)."""
        self.ops.append(("advance", dt))
        self.now += dt
        self.check(self.model, [], internal=False)

    def tick(self) -> None:
        """troth's timer at ``now``: every due deadline step and what it enables."""
        self.ops.append(("tick", None))
        before = self.model
        chain = m.tick(before, self.now)
        self.troth.tick(self.now)
        self.check(before, chain, internal=True)

    # -- after every step -------------------------------------------------------------

    def check(self, before: m.State, chain: list[m.Transition], internal: bool) -> None:
        """troth's store equals the model's; the 45 state properties hold of it; the 50
        transition properties hold of troth's (before, after) pair, except the few that
        do not compose (:data:`COMPOSITE_EXEMPT`), and of every single step of the
        model's chain between the same two states; a tick also keeps provenance."""
        self.steps += 1
        STATS.update((t.label[0], "fired") for t in chain if t.internal or t.label == ("gate",))
        expected = chain[-1].state if chain else before
        after = self.troth.snap()
        diff = state_diff(expected, after)
        if diff:
            fired = [t.label for t in chain]
            self.fail(f"store differs (model fired {fired}):\n  " + "\n  ".join(diff))
        # Equal to the model's, up to row order; troth's flow tables are not in the
        # snapshot, so the model keeps its own, compared through GET /ops/limits.
        self.model = replace(after, flow=expected.flow)
        if expected.flow.limits:
            self.check_limits(expected.flow, chain)
        now = self.now
        flow = FLOW_EXEMPT if expected.flow.limits else set()
        if bad := [x for x in state_failures(now, after) if x not in flow]:
            self.fail(f"state properties fail on troth's store: {bad}")
        skip = set(flow)
        if len(chain) > 1:
            skip |= COMPOSITE_EXEMPT
            if not internal and any(t.label[0] == "r5" for t in chain):
                skip |= EXPIRED_AT_GRANT_EXEMPT
        bad, found = trans_failures_with_findings(now, before, after, skip)
        if bad:
            self.fail(f"transition properties fail on troth's step: {bad}")
        if internal and (bad := internal_failures(now, before, after)):
            self.fail(f"provenance fails on troth's tick: {bad}")
        if not chain:  # a read, a search or a clock advance: one step that writes nothing
            chain = [m.Transition(("idle",), after, internal=False)]
        states = [before, *(t.state for t in chain[:-1]), after]
        for (a, b), tr in zip(itertools.pairwise(states), chain, strict=True):
            bad, more = trans_failures_with_findings(now, a, b, flow)
            if bad := [x for x in state_failures(now, b) if x not in flow] + bad:
                self.fail(f"the model's own step {tr.label} breaks {bad}")
            if tr.internal and (bad := internal_failures(now, a, b)):
                self.fail(f"the model's internal step {tr.label} breaks provenance: {bad}")
            found += more
        STATS.update(("finding", name) for name in found)

    def check_limits(self, flow: m.Flow, chain: list[m.Transition]) -> None:
        """Each limited group's slots in use and held tasks, as ``troth limits list``
        shows them, equal the model's."""
        ours = {
            x.group: (flow.in_use(x.group), sum(1 for h in flow.held if h.group == x.group))
            for x in flow.limits
        }
        theirs = self.troth.limits()
        if ours != theirs:
            fired = [t.label for t in chain]
            self.fail(f"limits differ (model fired {fired}):\n  model: {ours}\n  troth: {theirs}")


def replay(store: str, ops: Iterable[Op]) -> Differential:
    """Run a script against troth (``store``: memory, sqlite or postgres) and the model;
    raises :class:`Divergence` at the first difference or failed property."""
    diff = Differential(troth_for(store))
    for op in ops:
        diff.run(op)
    return diff
