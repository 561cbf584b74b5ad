"""Differential tests: random scripts against troth and the reference model.

A hypothesis state machine sends random requests — valid and invalid, over a small id
alphabet so that ids collide — moves the clock, and fires troth's timer (``debug.tick``).
After every step (:class:`model.mapping.Differential`): troth's answer equals the
model's, troth's whole store equals the model's, all 45 state properties hold of
troth's store and all 50 transition properties of the step (the few that do not
compose across troth's transaction — a request plus the internal steps it enabled —
are listed in ``model.mapping`` and checked on every single step of the model's chain
instead).  It runs on the memory, SQLite and PostgreSQL backends (PostgreSQL on a
throwaway database, emptied between scripts), in-process through the whole HTTP app.

``FlowMachine`` runs the same kind of scripts under troth's flow control (an extension,
docs/operations.md "Flow control"): a limit (concurrency, ``perKey``, rate) drawn and
set through the operator API before the first request, the model's gate beside
troth's, and each group's slots and held tasks compared too
(:data:`DEFAULT_FLOW_EXAMPLES`).

Covered: all 21 request kinds, searches included (troth serves them; pages are
compared by following each side's cursor), and schedules with a few periodic crons
and troth's occurrence ids (``~{id}/{template}``), so r1–r7 all fire.  Requests are
always well-typed JSON: wire-level garbage is test_wire.py's business.

A failure shrinks, and its message ends with a replayable script,
``replay('memory', [...])`` (``model.mapping.replay``), ready to paste into
``tests/differential/test_regressions.py``.

Run length (docs/testing.md): the default is fixed and derandomised (the same 200
examples on memory and on SQLite on every run, about 35 s for both, and
:data:`DEFAULT_PG_EXAMPLES` on PostgreSQL, where a step costs about three times as
much).  ``TROTH_DIFF_EXAMPLES=20000``
runs longer from a fresh random seed, in chunks of 500 that each print their seed
(pass it back as ``TROTH_DIFF_SEED`` with ``TROTH_DIFF_EXAMPLES=500`` to repeat one);
``TROTH_DIFF_STEPS`` sets the longest script.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    rule,
    run_state_machine_as_test,
)

from helpers.pgbouncer import needs_pgbouncer
from model.machine import Execute, external, project
from model.mapping import Differential, troth_for

DEFAULT_EXAMPLES = 200
#: The default run's examples on PostgreSQL: fewer, since each step there costs a few
#: round trips to the database and each script starts with a TRUNCATE (~40 ms).  Its
#: bugs are in SQL, which the store contract tests cover too; a long run
#: (``TROTH_DIFF_EXAMPLES``) runs the same number on every backend.
DEFAULT_PG_EXAMPLES = 50
#: Through PgBouncer in transaction mode: the same SQL, sent unprepared, each
#: transaction with its settings; fewer still, as a check of the pooled path.
DEFAULT_POOLED_EXAMPLES = 20
EXAMPLES = int(os.environ.get("TROTH_DIFF_EXAMPLES", DEFAULT_EXAMPLES))
STEPS = int(os.environ.get("TROTH_DIFF_STEPS", 40))
_seed_env = os.environ.get("TROTH_DIFF_SEED")
SEED: int | None = (
    int(_seed_env)
    if _seed_env
    else (random.randrange(2**32) if EXAMPLES != DEFAULT_EXAMPLES else None)
)

# ---------------------------------------------------------------------- the alphabet
# Small alphabets so that ids collide and guards meet.  Some arguments are symbolic and
# resolved against the model's current state, so that valid requests are common: a task
# id "@k" is the k-th existing task (schedule occurrences included), a version "=" is the
# task's current version and "+" the next, a pid "=" the lease holder.  The concrete
# request is what gets sent and recorded in the replayable script.

IDS = st.sampled_from(["a", "b", "c"])
NEW_IDS = st.sampled_from(["a", "b", "c", "a", "b", "c", "d", "~x", ""])  # reserved too
TASK_IDS = st.sampled_from(["a", "b", "c", "@0", "@1", "d"])


def tasks_in(state: str) -> st.SearchStrategy[str]:
    """Task ids, mostly one currently in ``state`` (so that the request can succeed)."""
    return st.sampled_from([f"@{state}", f"@{state}", f"@{state}", "a", "b", "@0", "@1", "d"])


TGT = {"resonate:target": "poll://any@w"}
EXT = {"resonate:external": "true"}
TAGS = st.sampled_from(
    [
        TGT,
        {},
        {"resonate:external": "true"},
        {"resonate:timer": "true"},
        {"resonate:target": "http://w.example/x"},
        {**TGT, "resonate:branch": "br"},
        {"resonate:external": "true", "resonate:branch": "br"},
        {"resonate:target": ""},  # known gap: accepted, dispatched to ""
        {**TGT, "resonate:delay": "9000"},  # an absolute instant
        {**TGT, "resonate:delay": "soon"},  # parseNat garbage
        {"resonate:timer": "true", **TGT},  # 400, except inside a fence
        {"resonate:timer": "false", "resonate:external": "false"},
        {"resonate:scope": "global", "resonate:branch": "br"},  # troth: external (TS SDK)
        {"resonate:scope": "local"},  # not external
    ]
)
TARGETED = st.sampled_from([TGT, {**TGT, "resonate:branch": "br"}, {"resonate:target": "http://w"}])
OFFSETS = st.sampled_from([20_000, 3000, 100, 1_000_000, 1, 0, -100])  # timeoutAt - now
VALUES = st.sampled_from([{}, {"data": "x"}, {"headers": {"h": "1"}, "data": "y"}])
STATES = st.sampled_from(
    ["resolved", "rejected", "rejected_canceled", "resolved", "pending", "rejected_timedout"]
)
ADDRESSES = st.sampled_from(
    ["http://l.example/1", "poll://any@l2", "https://l.example/3", "poll://nogroup", "ftp://x"]
)
PIDS = st.sampled_from(["w1", "w2"])
HOLDERS = st.sampled_from(["=", "=", "w1", "w2"])
TTLS = st.sampled_from([60_000, 5000, 60_000, 100, 0])
VERSIONS = st.sampled_from(["=", "=", "=", "=", 0, 1, 2, "+"])
ADVANCES = st.sampled_from([1, 99, 1000, 5000, 10_000, 30_000])
CRONS = st.sampled_from(["*/10 * * * * *", "*/10 * * * * *", "* * * * *", "*/30 * * * * *", "bad"])
TEMPLATES = st.sampled_from(
    ["{{.timestamp}}", "{{.id}}.{{.timestamp}}", "{{.timestamp}}", "{{.id}}"]
)
SCHEDULE_IDS = st.sampled_from(["s", "t", "s", "s/x"])
LIMITS = st.sampled_from([None, 1, 2, 0])


def create(id: str, timeout_at: int, tags: dict[str, str], param: Any = None) -> dict[str, Any]:
    data: dict[str, Any] = {"id": id, "timeoutAt": timeout_at, "tags": tags}
    if param:
        data["param"] = param
    return data


def envelope(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "head": {}, "data": data}


class DifferentialMachine(RuleBasedStateMachine):
    """One script per example; every rule is one step of :class:`Differential`."""

    store = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.d = Differential(troth_for(self.store))

    # -- symbolic arguments -----------------------------------------------------------

    def at(self, offset: int) -> int:
        return max(0, self.d.now + offset)

    def task(self, ref: str) -> str:
        """Resolve a symbolic id: "@k" the k-th existing task, "@acquired" (etc.) the
        first task in that state, "@w" a promise with an obligation to drain."""
        model = self.d.model
        if ref == "@w":
            owing = sorted(p.id for p in model.promises if p.callbacks or p.listeners)
            return owing[0] if owing else "a"
        if ref[:1] == "@" and ref[1:].isdigit():
            ids = sorted(t.id for t in model.tasks)
            return ids[int(ref[1:]) % len(ids)] if ids else "a"
        if ref[:1] == "@":
            ids = sorted(t.id for t in model.tasks if t.state == ref[1:])
            return ids[0] if ids else "a"
        return ref

    def awaited(self, id: str, k: int | str) -> str:
        """``"e0"``/``"e1"``: an existing external promise; an int: ``other``."""
        return self.awaitable(id, int(k[1:])) if isinstance(k, str) else self.other(id, k)

    def awaitable(self, id: str, k: int) -> str:
        """The k-th existing external promise other than ``id``, pending ones first
        (else ``other``)."""
        ps = [p for p in self.d.model.promises if p.id != id and external(p.tags)]
        ps.sort(key=lambda p: (project(p, self.d.now).state != "pending", p.id))
        return ps[k].id if k < len(ps) else self.other(id, k + 1)

    def other(self, id: str, k: int) -> str:
        """The id ``k`` places after ``id`` in a, b, c (0 is ``id`` itself)."""
        ring = ["a", "b", "c"]
        return ring[((ring.index(id) if id in ring else -1) + k) % 3] if k else id

    def version(self, id: str, ref: str | int) -> int:
        t = self.d.model.task(id)
        current = t.version if t is not None else 0
        if ref == "=":
            return current
        if ref == "+":
            return current + 1
        assert isinstance(ref, int)
        return ref

    def holder(self, id: str, ref: str) -> str:
        t = self.d.model.task(id)
        if ref == "=":
            return t.pid if t is not None and t.pid is not None else "w1"
        return ref

    def send(self, kind: str, data: dict[str, Any]) -> None:
        self.d.request(kind, data)

    # -- a starting world ---------------------------------------------------------------

    @initialize(
        world=st.sampled_from(["tasks", "tasks", "branch", "empty"]),
        deadline=st.sampled_from([20_000, 3000, 100]),
        ttl=TTLS,
    )
    def world(self, world: str, deadline: int, ttl: int) -> None:
        """Most scripts start with something to work on: an external promise ``c``, an
        acquired task ``a`` and a pending one ``b`` (ordinary requests, checked as
        such), so that the requests which need a live task can succeed from step one."""
        if world == "empty":
            return
        tags = {**TGT, "resonate:branch": "br"} if world == "branch" else TGT
        self.send(
            "promise.create", create("c", self.at(deadline), {**EXT, "resonate:branch": "br"})
        )
        action = envelope("promise.create", create("a", self.at(20_000), tags))
        self.send("task.create", {"pid": "w1", "ttl": ttl, "action": action})
        self.send("promise.create", create("b", self.at(deadline * 2), tags))

    # -- promises ---------------------------------------------------------------------

    @rule(id=NEW_IDS, offset=OFFSETS, tags=TAGS, param=VALUES)
    def promise_create(self, id: str, offset: int, tags: Any, param: Any) -> None:
        self.send("promise.create", create(id, self.at(offset), tags, param))

    @rule(id=IDS, offset=OFFSETS, tags=TARGETED)
    def promise_create_targeted(self, id: str, offset: int, tags: Any) -> None:
        self.send("promise.create", create(id, self.at(offset), tags))

    @rule(id=IDS)
    def promise_get(self, id: str) -> None:
        self.send("promise.get", {"id": id})

    @rule(id=st.sampled_from(["a", "b", "c", "@w", "@w"]), state=STATES, value=VALUES)
    def promise_settle(self, id: str, state: str, value: Any) -> None:
        self.send("promise.settle", {"id": self.task(id), "state": state, "value": value})

    @rule(awaited=IDS, awaiter=st.sampled_from(["@suspended", "@acquired", "a", "b", "@0"]))
    def promise_register_callback(self, awaited: str, awaiter: str) -> None:
        data = {"awaited": awaited, "awaiter": self.task(awaiter)}
        self.send("promise.register_callback", data)

    @rule(awaited=IDS, address=ADDRESSES)
    def promise_register_listener(self, awaited: str, address: str) -> None:
        self.send("promise.register_listener", {"awaited": awaited, "address": address})

    @rule(
        state=st.sampled_from([None, "pending", "resolved", "rejected_timedout", "done"]),
        tags=st.sampled_from([{}, {"resonate:branch": "br"}, TGT]),
        limit=LIMITS,
    )
    def promise_search(self, state: str | None, tags: Any, limit: int | None) -> None:
        data: dict[str, Any] = {"tags": tags}
        if state is not None:
            data["state"] = state
        if limit is not None:
            data["limit"] = limit
        self.send("promise.search", data)

    # -- tasks ------------------------------------------------------------------------

    @rule(id=TASK_IDS)
    def task_get(self, id: str) -> None:
        self.send("task.get", {"id": self.task(id)})

    @rule(id=NEW_IDS, pid=PIDS, ttl=TTLS, offset=OFFSETS, tags=TAGS, param=VALUES)
    def task_create(self, id: str, pid: str, ttl: int, offset: int, tags: Any, param: Any) -> None:
        action = envelope("promise.create", create(id, self.at(offset), tags, param))
        self.send("task.create", {"pid": pid, "ttl": ttl, "action": action})

    @rule(id=IDS, pid=PIDS, ttl=TTLS, offset=OFFSETS, tags=TARGETED)
    def task_create_targeted(self, id: str, pid: str, ttl: int, offset: int, tags: Any) -> None:
        action = envelope("promise.create", create(id, self.at(offset), tags))
        self.send("task.create", {"pid": pid, "ttl": ttl, "action": action})

    @rule(id=tasks_in("pending"), version=VERSIONS, pid=PIDS, ttl=TTLS)
    def task_acquire(self, id: str, version: Any, pid: str, ttl: int) -> None:
        id = self.task(id)
        data = {"id": id, "version": self.version(id, version), "pid": pid, "ttl": ttl}
        self.send("task.acquire", data)

    @rule(
        id=tasks_in("acquired"),
        version=VERSIONS,
        inner=st.sampled_from([1, 2, 1, 2, 0, "~x", ""]),
        offset=OFFSETS,
        tags=TAGS,
    )
    def task_fence_create(self, id: str, version: Any, inner: Any, offset: int, tags: Any) -> None:
        id = self.task(id)
        inner = self.other(id, inner) if isinstance(inner, int) else inner
        action = envelope("promise.create", create(inner, self.at(offset), tags))
        self.send("task.fence", {"id": id, "version": self.version(id, version), "action": action})

    @rule(
        id=tasks_in("acquired"),
        version=VERSIONS,
        inner=st.sampled_from([1, 2, "@w", 0]),
        state=STATES,
        value=VALUES,
    )
    def task_fence_settle(self, id: str, version: Any, inner: Any, state: str, value: Any) -> None:
        id = self.task(id)
        inner = self.other(id, inner) if isinstance(inner, int) else self.task(inner)
        action = envelope("promise.settle", {"id": inner, "state": state, "value": value})
        self.send("task.fence", {"id": id, "version": self.version(id, version), "action": action})

    @rule(refs=st.lists(st.tuples(tasks_in("acquired"), VERSIONS, HOLDERS), min_size=1, max_size=3))
    def task_heartbeat(self, refs: list[tuple[str, Any, str]]) -> None:
        ids = [self.task(id) for id, _, _ in refs]
        tasks = [
            {"id": id, "version": self.version(id, v)}
            for id, (_, v, _) in zip(ids, refs, strict=True)
        ]
        self.send("task.heartbeat", {"pid": self.holder(ids[0], refs[0][2]), "tasks": tasks})

    @rule(
        id=tasks_in("acquired"),
        version=VERSIONS,
        awaited=st.sampled_from([["e0"], ["e0"], ["e1"], ["e0", "e1"], [1], [1, 2], [1, 1], [0]]),
        awaiter=st.sampled_from([None, None, "d"]),
    )
    def task_suspend(self, id: str, version: Any, awaited: list[Any], awaiter: str | None) -> None:
        id = self.task(id)
        actions = [
            envelope(
                "promise.register_callback",
                {"awaited": self.awaited(id, k), "awaiter": awaiter or id},
            )
            for k in awaited
        ]
        data = {"id": id, "version": self.version(id, version), "actions": actions}
        self.send("task.suspend", data)

    @rule(
        id=tasks_in("acquired"), version=VERSIONS, state=STATES, value=VALUES, other=st.booleans()
    )
    def task_fulfill(self, id: str, version: Any, state: str, value: Any, other: bool) -> None:
        id = self.task(id)
        settle = {"id": "zz" if other else id, "state": state, "value": value}
        action = envelope("promise.settle", settle)
        self.send(
            "task.fulfill", {"id": id, "version": self.version(id, version), "action": action}
        )

    @rule(id=tasks_in("acquired"), version=VERSIONS)
    def task_release(self, id: str, version: Any) -> None:
        id = self.task(id)
        self.send("task.release", {"id": id, "version": self.version(id, version)})

    @rule(id=st.sampled_from(["@acquired", "@pending", "@suspended", "a", "@0", "d"]))
    def task_halt(self, id: str) -> None:
        self.send("task.halt", {"id": self.task(id)})

    @rule(id=tasks_in("halted"))
    def task_continue(self, id: str) -> None:
        self.send("task.continue", {"id": self.task(id)})

    @rule(
        state=st.sampled_from([None, "pending", "acquired", "fulfilled", "running"]),
        limit=LIMITS,
    )
    def task_search(self, state: str | None, limit: int | None) -> None:
        data: dict[str, Any] = {}
        if state is not None:
            data["state"] = state
        if limit is not None:
            data["limit"] = limit
        self.send("task.search", data)

    @rule(
        kind=st.sampled_from(["task.create", "task.fence", "task.suspend", "task.fulfill"]),
        id=IDS,
    )
    def task_wrong_action(self, kind: str, id: str) -> None:
        """A nested action of a kind the outer request does not take, or a suspend with
        no actions at all: 400 either way, before any lookup."""
        action = envelope("promise.get", {"id": id})
        data: dict[str, Any] = {"id": id, "version": self.version(id, "="), "pid": "w1", "ttl": 1}
        if kind == "task.suspend":
            data["actions"] = [action] if self.d.steps % 2 else []
        else:
            data["action"] = action
        self.send(kind, data)

    # -- schedules --------------------------------------------------------------------

    @rule(
        id=SCHEDULE_IDS,
        cron=CRONS,
        template=TEMPLATES,
        timeout=st.sampled_from([5000, 0, 60_000]),
        tags=st.sampled_from(
            [TGT, {}, TGT, {"resonate:branch": "br"}, {"resonate:timer": "true", **TGT}]
        ),
    )
    def schedule_create(self, id: str, cron: str, template: str, timeout: int, tags: Any) -> None:
        data = {
            "id": id,
            "cron": cron,
            "promiseId": template,
            "promiseTimeout": timeout,
            "promiseParam": {"data": "p"},
            "promiseTags": tags,
        }
        self.send("schedule.create", data)

    @rule(id=SCHEDULE_IDS)
    def schedule_get(self, id: str) -> None:
        self.send("schedule.get", {"id": id})

    @rule(id=SCHEDULE_IDS)
    def schedule_delete(self, id: str) -> None:
        self.send("schedule.delete", {"id": id})

    @rule(limit=LIMITS, tags=st.sampled_from([{}, TGT]))
    def schedule_search(self, limit: int | None, tags: Any) -> None:
        data: dict[str, Any] = {"tags": tags}
        if limit is not None:
            data["limit"] = limit
        self.send("schedule.search", data)

    # -- the clock --------------------------------------------------------------------

    @rule(dt=ADVANCES)
    def advance(self, dt: int) -> None:
        self.d.advance(dt)

    @rule()
    def tick(self) -> None:
        self.d.tick()

    @rule(dt=ADVANCES)
    def advance_and_tick(self, dt: int) -> None:
        self.d.advance(dt)
        self.d.tick()


FLOW_TAGS = st.sampled_from(
    [
        TGT,
        {},
        EXT,
        {**TGT, "troth:key": "k1"},
        {**TGT, "troth:key": "k2"},
        {**TGT, "troth:priority": "5"},
        {**TGT, "troth:key": "k1", "troth:priority": "5"},
        {**TGT, "troth:priority": "-1", "troth:key": "k2"},
        {**TGT, "troth:priority": "x"},  # not an integer: 0
        {"resonate:target": "http://w.example/x", "troth:key": "k1"},
        {"resonate:target": "poll://uni@w/p1", "troth:key": "k2"},
    ]
)

#: More ids for the flow variant's creates: an order shows when several tasks wait.
FLOW_IDS = st.sampled_from(["e", "f", "g", "h", "a", "b"])


class FlowMachine(DifferentialMachine):
    """The same scripts under troth's flow control (docs/operations.md "Flow control"):
    before the first request the operator API sets a limit on the scripts' group ``w``
    (concurrency, sometimes ``perKey``, sometimes a rate of 1/s or 10/s with a burst of
    1 or 2; sometimes a concurrency limit on the push target ``http://w.example`` too); more creates carry ``troth:key`` / ``troth:priority``.
    Compared as ever, and after each step each group's slots in use and held tasks
    (``GET /ops/limits``) against the model's gate."""

    @initialize(
        world=st.sampled_from(["tasks", "tasks", "branch", "empty"]),
        deadline=st.sampled_from([20_000, 3000, 100]),
        ttl=TTLS,
        concurrency=st.sampled_from([1, 2, 1, 3, None]),
        per_key=st.sampled_from([None, None, 1, 2]),
        rate=st.sampled_from([None, None, 1, 10]),
        burst=st.sampled_from([None, 2]),
        push=st.booleans(),
    )
    def world(  # type: ignore[override]
        self,
        world: str,
        deadline: int,
        ttl: int,
        concurrency: int | None,
        per_key: int | None,
        rate: int | None,
        burst: int | None,
        push: bool,
    ) -> None:
        if concurrency is None and per_key is None and rate is None:
            concurrency = 1
        body: dict[str, Any] = {
            "group": "w",
            "concurrency": concurrency,
            "perKey": per_key,
            "rate": rate,
            "burst": burst if rate is not None else None,
        }
        self.d.limit({k: v for k, v in body.items() if v is not None})
        if push:
            self.d.limit({"group": "http://w.example", "concurrency": 1})
        super().world(world, deadline, ttl)

    # Fewer rules that never touch a task, so that more steps do: reads and searches
    # are the same code with or without a limit (the base machine covers them).
    promise_search = task_search = schedule_get = schedule_search = schedule_delete = None
    promise_register_listener = task_wrong_action = promise_get = task_get = None
    promise_create = task_create = task_fence_create = None  # flow_* create instead

    @rule(id=FLOW_IDS, offset=st.sampled_from([20_000, 20_000, 3000, 100]), tags=FLOW_TAGS)
    def flow_promise_create(self, id: str, offset: int, tags: Any) -> None:
        self.send("promise.create", create(id, self.at(offset), tags))

    @rule(
        ids=st.permutations(["e", "f", "g", "h"]),
        tags=st.lists(FLOW_TAGS, min_size=2, max_size=4),
    )
    def flow_burst(self, ids: list[str], tags: list[Any]) -> None:
        """Several tasks at once, so that several wait and their order shows."""
        for id, t in zip(ids, tags, strict=False):
            self.send("promise.create", create(id, self.at(20_000), t))

    @rule(id=FLOW_IDS, pid=PIDS, ttl=TTLS, offset=st.sampled_from([20_000, 3000]), tags=FLOW_TAGS)
    def flow_task_create(self, id: str, pid: str, ttl: int, offset: int, tags: Any) -> None:
        action = envelope("promise.create", create(id, self.at(offset), tags))
        self.send("task.create", {"pid": pid, "ttl": ttl, "action": action})

    def task(self, ref: str) -> str:
        """Also "@sent": a pending task with an ``execute`` of its version in the
        outbox (let through), and "@held": one the model's gate holds."""
        model = self.d.model
        if ref == "@sent":
            sent = {
                e.message.task_id
                for e in model.outbox
                if isinstance(e.message, Execute)
                and (t := model.task(e.message.task_id)) is not None
                and t.state == "pending"
                and t.version == e.message.version
            }
            return min(sent, default="a")
        if ref == "@held":
            return min((h.task_id for h in model.flow.held), default="a")
        return super().task(ref)

    @rule(id=st.sampled_from(["@sent", "@held", "@sent", "@held", "@pending", "@0"]), pid=PIDS)
    def flow_task_acquire(self, id: str, pid: str) -> None:
        """An acquire of the current version: a let-through task's (200) or a held
        one's (409 while it waits)."""
        id = self.task(id)
        data = {"id": id, "version": self.version(id, "="), "pid": pid, "ttl": 60_000}
        self.send("task.acquire", data)

    @rule(id=tasks_in("acquired"), settle=st.booleans())
    def flow_task_done(self, id: str, settle: bool) -> None:
        """Frees a slot: a fulfil, or a release (its task queued again)."""
        id = self.task(id)
        version = self.version(id, "=")
        if settle:
            action = envelope("promise.settle", {"id": id, "state": "resolved", "value": {}})
            self.send("task.fulfill", {"id": id, "version": version, "action": action})
        else:
            self.send("task.release", {"id": id, "version": version})


class MemoryDifferential(DifferentialMachine):
    store = "memory"


class SqliteDifferential(DifferentialMachine):
    store = "sqlite"


class PostgresDifferential(DifferentialMachine):
    store = "postgres"


class PooledDifferential(DifferentialMachine):
    """PostgreSQL through PgBouncer in transaction mode (``postgres_pool_mode``)."""

    store = "postgres-transaction"


class MemoryFlow(FlowMachine):
    store = "memory"


class SqliteFlow(FlowMachine):
    store = "sqlite"


class PostgresFlow(FlowMachine):
    store = "postgres"


SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    derandomize=SEED is None,
    database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=False,
)


#: Examples per hypothesis run: its search tree grows with every example, so a long
#: run is a series of runs of this size, with consecutive seeds (memory stays ~150 MB).
CHUNK = 500


@pytest.mark.timeout(0 if SEED is not None else 600)  # a long run takes as long as it takes
@pytest.mark.parametrize(
    "machine",
    [
        MemoryDifferential,
        SqliteDifferential,
        PostgresDifferential,
        pytest.param(PooledDifferential, marks=needs_pgbouncer),
    ],
    ids=["memory", "sqlite", "postgres", "pgbouncer-transaction"],
)
def test_troth_agrees_with_the_model(machine: type[DifferentialMachine]) -> None:
    """Random scripts: every answer, every store and every property, after every step."""
    if SEED is None:
        examples = {
            PostgresDifferential: DEFAULT_PG_EXAMPLES,
            PooledDifferential: DEFAULT_POOLED_EXAMPLES,
        }.get(machine, EXAMPLES)
        run_state_machine_as_test(machine, settings=settings(SETTINGS, max_examples=examples))
        return
    for i, start in enumerate(range(0, EXAMPLES, CHUNK)):
        n = min(CHUNK, EXAMPLES - start)
        print(
            f"run {i}: TROTH_DIFF_SEED={SEED + i} TROTH_DIFF_EXAMPLES={n} TROTH_DIFF_STEPS={STEPS}"
        )
        run_state_machine_as_test(
            seed(SEED + i)(machine), settings=settings(SETTINGS, max_examples=n)
        )


#: The flow-control variant's default examples (the limit drawn first, then a script).
DEFAULT_FLOW_EXAMPLES = 80
DEFAULT_PG_FLOW_EXAMPLES = 20


@pytest.mark.timeout(0 if SEED is not None else 600)
@pytest.mark.parametrize(
    "machine", [MemoryFlow, SqliteFlow, PostgresFlow], ids=["memory", "sqlite", "postgres"]
)
def test_troth_agrees_with_the_model_under_limits(machine: type[FlowMachine]) -> None:
    """Random scripts under a concurrency limit: answers (409 refusals of
    ``task.acquire`` included), stores (which tasks have an ``execute``), properties,
    and each group's slots and held tasks, after every step."""
    if SEED is None:
        examples = DEFAULT_PG_FLOW_EXAMPLES if machine is PostgresFlow else DEFAULT_FLOW_EXAMPLES
        run_state_machine_as_test(machine, settings=settings(SETTINGS, max_examples=examples))
        return
    for i, start in enumerate(range(0, EXAMPLES, CHUNK)):
        n = min(CHUNK, EXAMPLES - start)
        print(
            f"run {i}: TROTH_DIFF_SEED={SEED + i} TROTH_DIFF_EXAMPLES={n} TROTH_DIFF_STEPS={STEPS}"
        )
        run_state_machine_as_test(
            seed(SEED + i)(machine), settings=settings(SETTINGS, max_examples=n)
        )
