"""The reference model: SPEC.md §2–5, transcribed plainly over in-memory lists.

Written from the specification only (never from ``troth.machine``), so the
differential tests compare two separate readings of one text.  It is meant to be read
side by side with SPEC.md: one function per request, named after its number (``p01``
… ``s04``), guards in the specification's order, one function per internal step
(``r1`` … ``r7``).  Speed does not matter; every lookup is a linear scan.

The shape follows the Lean machine (SPEC.md §1): a step is a pure function of the
pre-state and ``now`` that returns a response and a list of writes; reads never see
the step's own writes; the writes are keyed upserts applied in order at the end.
Client requests read with the *projected* discipline (troth's choice, latitude L1);
internal steps touch (materialise) or view exactly as §5 says.

Where the specification leaves a choice, the model follows troth's documented one
(docs/protocol.md), and each such place is marked ``troth:``:

* which internal steps fire when (``after_request`` and ``tick`` at the bottom);
* served searches, ``preload``, schedules (cron, occurrence ids and tags);
* reserved ids (``~…`` and ``""``) at every create door;
* the fenced SDK sleep: timer + target inside ``task.fence`` is stored as a plain timer;
* ``external`` also counts ``resonate:scope`` = ``"global"`` (the TypeScript SDK's
  awaitable promises);
* flow control, troth's extension beyond the specification (docs/operations.md "Flow
  control", docs/protocol.md "Concurrency limits"): concurrency limits per worker
  group with ``troth:priority``, turns across ``troth:key`` and ``perKey``, kept by a
  gate after each job (``gate`` below, written from those two pages), and rate
  limits as a token bucket counting starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

RETRY_TIMEOUT = 5000  # ServerConfig.retryTimeout (ms), troth's default
PROTOCOL_VERSION = "2026-04-01"

PENDING = "pending"
RESOLVED = "resolved"
REJECTED = "rejected"
REJECTED_CANCELED = "rejected_canceled"
REJECTED_TIMEDOUT = "rejected_timedout"
PROMISE_STATES = (PENDING, RESOLVED, REJECTED, REJECTED_CANCELED, REJECTED_TIMEDOUT)
SETTABLE = (RESOLVED, REJECTED, REJECTED_CANCELED)

ACQUIRED = "acquired"
SUSPENDED = "suspended"
HALTED = "halted"
FULFILLED = "fulfilled"
TASK_STATES = (PENDING, ACQUIRED, SUSPENDED, HALTED, FULFILLED)

TARGET = "resonate:target"
TIMER = "resonate:timer"
EXTERNAL = "resonate:external"
SCOPE = "resonate:scope"
DELAY = "resonate:delay"
BRANCH = "resonate:branch"

Tags = dict[str, str]
Json = dict[str, Any]


# ---------------------------------------------------------------------- §2.1 records


@dataclass(frozen=True)
class Value:
    """A payload; ``{}`` on the wire is the empty value."""

    headers: Tags = field(default_factory=dict)
    data: str | None = None

    @staticmethod
    def of(obj: Json | None) -> Value:
        obj = obj or {}
        return Value(dict(obj.get("headers") or {}), obj.get("data"))

    def is_empty(self) -> bool:
        return not self.headers and self.data is None

    def wire(self) -> Json:
        out: Json = {}
        if self.headers:
            out["headers"] = dict(self.headers)
        if self.data is not None:
            out["data"] = self.data
        return out


EMPTY = Value()


# ---------------------------------------------------------------------- §2.2 store objects


@dataclass(frozen=True)
class Promise:
    id: str
    state: str
    param: Value
    value: Value
    tags: Tags
    timeout_at: int
    created_at: int
    settled_at: int | None = None
    callbacks: tuple[str, ...] = ()  # awaiter promise ids
    listeners: tuple[str, ...] = ()  # addresses

    def record(self) -> Json:
        """``toRecord``: the wire record, without the two ledgers."""
        out: Json = {
            "id": self.id,
            "state": self.state,
            "param": self.param.wire(),
            "value": self.value.wire(),
            "tags": dict(self.tags),
            "timeoutAt": self.timeout_at,
            "createdAt": self.created_at,
        }
        if self.settled_at is not None:
            out["settledAt"] = self.settled_at
        return out

    def without_ledgers(self) -> Promise:
        return replace(self, callbacks=(), listeners=())


@dataclass(frozen=True)
class Task:
    id: str
    state: str
    version: int
    ttl: int | None = None
    pid: str | None = None
    expires_at: int | None = None  # lease deadline
    retry_at: int | None = None  # dispatch deadline
    resumes: tuple[str, ...] = ()

    def record(self) -> Json:
        """``toRecord``: resumes as a count, deadlines hidden."""
        out: Json = {
            "id": self.id,
            "state": self.state,
            "version": self.version,
            "resumes": len(self.resumes),
        }
        if self.ttl is not None:
            out["ttl"] = self.ttl
        if self.pid is not None:
            out["pid"] = self.pid
        return out


@dataclass(frozen=True)
class Schedule:
    id: str
    cron: str
    promise_id: str
    promise_timeout: int
    promise_param: Value
    promise_tags: Tags
    created_at: int
    next_run_at: int
    last_run_at: int | None = None

    def record(self) -> Json:
        out: Json = {
            "id": self.id,
            "cron": self.cron,
            "promiseId": self.promise_id,
            "promiseTimeout": self.promise_timeout,
            "promiseParam": self.promise_param.wire(),
            "promiseTags": dict(self.promise_tags),
            "createdAt": self.created_at,
            "nextRunAt": self.next_run_at,
        }
        if self.last_run_at is not None:
            out["lastRunAt"] = self.last_run_at
        return out


@dataclass(frozen=True)
class Execute:
    task_id: str
    version: int


@dataclass(frozen=True)
class Unblock:
    promise: Promise  # the record: ledgers always empty


Message = Execute | Unblock


@dataclass(frozen=True)
class Entry:
    """An outbox entry; its key makes ``setMessage`` an upsert (§2.1)."""

    address: str
    message: Message

    @property
    def key(self) -> str:
        if isinstance(self.message, Execute):
            return self.message.task_id
        return f"{self.message.promise.id}:notify:{self.address}"


@dataclass(frozen=True)
class Limit:
    """troth: a limit on a worker group: ``concurrency`` (``None``: no cap),
    ``per_key``, and ``rate`` starts a second with a bucket of ``burst`` tokens."""

    group: str
    concurrency: int | None = None
    per_key: int | None = None
    rate: float | None = None
    burst: int = 1

    def next_start(self, tat: float) -> float:
        """When the bucket next has a token: ``tat`` is the instant it is full again
        (each start adds 1/rate to it); a start needs it within ``burst - 1``
        intervals of now."""
        assert self.rate is not None
        return tat - (self.burst - 1) * 1000 / self.rate

    def take(self, tat: float, now: int) -> float:
        """A start at ``now`` (in debt if the bucket is empty: ``task.create``)."""
        assert self.rate is not None
        return max(tat, now) + 1000 / self.rate


@dataclass(frozen=True)
class Held:
    """troth: a task queued for a slot of its group, where its ``execute`` goes once let
    through, and its place: priority, turn, creation (then id)."""

    task_id: str
    group: str
    address: str
    priority: int
    created_at: int
    key: str
    turn: int

    def place(self) -> tuple[int, int, int, str]:
        return (-self.priority, self.turn, self.created_at, self.task_id)


@dataclass(frozen=True)
class Flow:
    """troth's flow-control bookkeeping (not the specification's): the limits, the
    tasks holding a slot (id, group, key), the held tasks, and per group the turn of
    the last task let through.  Empty (no limit) changes nothing."""

    limits: tuple[Limit, ...] = ()
    slots: tuple[tuple[str, str, str], ...] = ()
    held: tuple[Held, ...] = ()
    turns: tuple[tuple[str, int], ...] = ()
    tats: tuple[tuple[str, float], ...] = ()  # rate limits: when each bucket is full

    def limit(self, group: str | None) -> Limit | None:
        return next((x for x in self.limits if x.group == group), None)

    def slot(self, id: str) -> tuple[str, str, str] | None:
        return next((x for x in self.slots if x[0] == id), None)

    def queued(self, id: str) -> Held | None:
        return next((h for h in self.held if h.task_id == id), None)

    def in_use(self, group: str, key: str | None = None) -> int:
        return sum(1 for _, g, k in self.slots if g == group and (key is None or k == key))

    def turn(self, group: str) -> int:
        return next((n for g, n in self.turns if g == group), 0)


@dataclass(frozen=True)
class State:
    """``ServerState``: four lists keyed by id / key; ``State()`` is ``init``.  ``flow``
    is troth's extension (flow control), empty unless a limit is set."""

    promises: tuple[Promise, ...] = ()
    tasks: tuple[Task, ...] = ()
    schedules: tuple[Schedule, ...] = ()
    outbox: tuple[Entry, ...] = ()
    flow: Flow = Flow()

    def promise(self, id: str) -> Promise | None:
        return next((p for p in self.promises if p.id == id), None)

    def task(self, id: str) -> Task | None:
        return next((t for t in self.tasks if t.id == id), None)

    def schedule(self, id: str) -> Schedule | None:
        return next((c for c in self.schedules if c.id == id), None)


# ---------------------------------------------------------------------- §2.3 derived predicates


def is_timer(tags: Tags) -> bool:
    return tags.get(TIMER) == "true"


def targeted(tags: Tags) -> bool:
    return TARGET in tags  # presence, any value (even "")


def external(tags: Tags) -> bool:
    # troth: a promise tagged resonate:scope = "global" is external too (docs/protocol.md,
    # "resonate:scope: global is external"); "local" or any other value is not.
    return (
        tags.get(EXTERNAL) == "true"
        or targeted(tags)
        or is_timer(tags)
        or tags.get(SCOPE) == "global"
    )


def timer_targeted(tags: Tags) -> bool:
    return is_timer(tags) and targeted(tags)


def settable(state: str) -> bool:
    return state in SETTABLE


def address_valid(address: str) -> bool:
    if address.startswith(("http://", "https://")):
        return True
    if address.startswith("nats://"):
        # troth's extension (docs/protocol.md): nats:// + a literal NATS subject.
        tokens = address[len("nats://") :].split(".")
        return all(t and t not in ("*", ">") and not any(c.isspace() for c in t) for t in tokens)
    return address.startswith("poll://") and "@" in address


def parse_nat(text: str) -> int:
    """Total left fold ``acc*10 + (ord(c) - ord('0'))``, truncated subtraction."""
    acc = 0
    for ch in text:
        acc = acc * 10 + max(ord(ch) - ord("0"), 0)
    return acc


def add_once(items: tuple[str, ...], x: str) -> tuple[str, ...]:
    """``addCallback`` / ``addListener``: append if absent."""
    return items if x in items else (*items, x)


def project(p: Promise, now: int) -> Promise:
    """Fact P: a pending promise past its deadline reads as settled at its deadline."""
    if p.state == PENDING and p.timeout_at <= now:
        verdict = RESOLVED if is_timer(p.tags) else REJECTED_TIMEDOUT
        return replace(p, state=verdict, settled_at=p.timeout_at)
    return p


def fulfill(t: Task) -> Task:
    return replace(
        t, state=FULFILLED, pid=None, ttl=None, expires_at=None, retry_at=None, resumes=()
    )


def view(t: Task, p: Promise) -> Task:
    """Fact T: a task whose (projected) promise is settled reads as fulfilled."""
    if p.state != PENDING and t.state != FULFILLED:
        return fulfill(t)
    return t


# ---------------------------------------------------------------------- one step (§1, §3)


@dataclass(frozen=True)
class Response:
    status: int
    data: Json | None = None  # None for a refusal: troth sends a message string


def ok(data: Json) -> Response:
    return Response(200, data)


def refuse(status: int) -> Response:
    return Response(status)


Write = tuple[str, Any]  # ("promise", Promise) | ("task", Task) | ("schedule", Schedule)
#                          ("unschedule", id) | ("message", Entry)


class Step:
    """One step against a fixed pre-state: reads see only the pre-state, writes are
    collected in emission order and applied at the end (SPEC.md §1)."""

    def __init__(self, state: State, now: int, mat: bool = False) -> None:
        self.state = state
        self.now = now
        self.mat = mat
        self.writes: list[Write] = []

    # writes (§2.2 effects)
    def set_promise(self, p: Promise) -> None:
        self.writes.append(("promise", p))

    def set_task(self, t: Task) -> None:
        self.writes.append(("task", t))

    def set_schedule(self, c: Schedule) -> None:
        self.writes.append(("schedule", c))

    def del_schedule(self, id: str) -> None:
        self.writes.append(("unschedule", id))

    def set_message(self, address: str, message: Message) -> None:
        self.writes.append(("message", Entry(address, message)))

    # shared reads and writes (§3)
    def read_promise(self, id: str, mat: bool | None = None) -> Promise | None:
        p = self.state.promise(id)
        if p is None:
            return None
        q = project(p, self.now)
        if (self.mat if mat is None else mat) and q.state != p.state:
            self.set_settled(q)
        return q

    def read_task(self, id: str, mat: bool | None = None) -> tuple[Task | None, Promise | None]:
        t = self.state.task(id)
        if t is None:
            return None, None
        p = self.read_promise(t.id, mat)
        if p is None:
            return t, None
        u = view(t, p)
        if (self.mat if mat is None else mat) and u.state != t.state:
            self.set_task(u)
        return u, p

    def touch_promise(self, id: str) -> Promise | None:
        return self.read_promise(id, mat=True)

    def touch_task(self, id: str) -> tuple[Task | None, Promise | None]:
        return self.read_task(id, mat=True)

    def view_promise(self, id: str) -> Promise | None:
        return self.read_promise(id, mat=False)

    def set_settled(self, p: Promise) -> None:
        """Settling a promise fulfils its co-keyed task in the same step."""
        self.set_promise(p)
        t = self.state.task(p.id)
        if p.state != PENDING and t is not None and t.state != FULFILLED:
            self.set_task(fulfill(t))

    def create_promise(
        self, id: str, timeout_at: int, param: Value, tags: Tags, now: int | None = None
    ) -> Promise:
        """``createPromise``: live birth (pending, task pending v0 with ``retryAt``) or
        born dead (settled at its deadline, task fulfilled v0).  No outbox write."""
        now = self.now if now is None else now
        if timeout_at > now:
            p = Promise(id, PENDING, param, EMPTY, tags, timeout_at, created_at=now)
            self.set_promise(p)
            if targeted(tags):
                retry_at = max(parse_nat(tags[DELAY]), now) if DELAY in tags else now
                self.set_task(Task(id, PENDING, 0, retry_at=retry_at))
        else:
            verdict = RESOLVED if is_timer(tags) else REJECTED_TIMEDOUT
            p = Promise(
                id, verdict, param, EMPTY, tags, timeout_at, timeout_at, settled_at=timeout_at
            )
            self.set_promise(p)
            if targeted(tags):
                self.set_task(Task(id, FULFILLED, 0))
        return p


def apply(state: State, writes: Iterable[Write]) -> State:
    """Keyed upsert, in order: remove any row with the same key, add the new one."""
    promises, tasks = list(state.promises), list(state.tasks)
    schedules, outbox = list(state.schedules), list(state.outbox)
    for kind, obj in writes:
        if kind == "promise":
            promises = [p for p in promises if p.id != obj.id] + [obj]
        elif kind == "task":
            tasks = [t for t in tasks if t.id != obj.id] + [obj]
        elif kind == "schedule":
            schedules = [c for c in schedules if c.id != obj.id] + [obj]
        elif kind == "unschedule":
            schedules = [c for c in schedules if c.id != obj]
        elif kind == "message":
            outbox = [e for e in outbox if e.key != obj.key] + [obj]
        else:  # pragma: no cover - a typo in this file
            raise ValueError(kind)
    return State(tuple(promises), tuple(tasks), tuple(schedules), tuple(outbox), state.flow)


# ---------------------------------------------------------------------- troth's doors


def reserved(id: str) -> bool:
    """troth: ``~…`` ids belong to schedule occurrences and ``""`` is no id; a client
    create of either is 400 (docs/protocol.md "Ids", SPEC.md §5.3)."""
    return id == "" or id.startswith("~")


def action_of(action: Json, kinds: tuple[str, ...]) -> Json | None:
    """A nested action's ``data`` if its kind is one the outer request takes (else the
    outer request is 400, as troth decodes it)."""
    if not isinstance(action, dict) or action.get("kind") not in kinds:
        return None
    data: Json = action.get("data") or {}
    return data


@dataclass(frozen=True)
class Preload:
    """troth: ``preload`` lists the other promises with the task's ``resonate:branch``,
    projected, in id order, at most 1000, as they are *after* the request's writes
    (docs/protocol.md "preload"; the spec never fills it).  A handler leaves this
    placeholder and ``handle`` fills it in from the post-state."""

    task_id: str

    def resolve(self, state: State, now: int) -> list[Json]:
        own = state.promise(self.task_id)
        if own is None or BRANCH not in own.tags:
            return []
        branch = own.tags[BRANCH]
        same = [p for p in state.promises if p.id != own.id and p.tags.get(BRANCH) == branch]
        return [project(p, now).record() for p in sorted(same, key=lambda p: p.id)][:1000]


# ---------------------------------------------------------------------- §4.1 promises


def p01_promise_get(s: Step, req: Json) -> Response:
    p = s.read_promise(req["id"])
    if p is None:
        return refuse(404)
    return ok({"promise": p.record()})


def p02_promise_create(s: Step, req: Json, fenced: bool = False) -> Response:
    tags: Tags = dict(req.get("tags") or {})
    if timer_targeted(tags):
        if not fenced:
            return refuse(400)
        # troth: an SDK durable sleep through task.fence is stored as a plain timer
        # (docs/protocol.md "Durable sleeps from the SDKs").
        del tags[TARGET]
    if reserved(req["id"]):
        return refuse(400)
    p = s.read_promise(req["id"])
    if p is not None:
        return ok({"promise": p.record()})
    p = s.create_promise(req["id"], req["timeoutAt"], Value.of(req.get("param")), tags)
    return ok({"promise": p.record()})


def p03_promise_settle(s: Step, req: Json) -> Response:
    if not settable(req["state"]):
        return refuse(400)
    p = s.read_promise(req["id"])
    if p is None:
        return refuse(404)
    if p.state == PENDING:
        q = replace(p, state=req["state"], value=Value.of(req.get("value")), settled_at=s.now)
        s.set_settled(q)
        return ok({"promise": q.record()})
    return ok({"promise": p.record()})


def p04_promise_register_callback(s: Step, req: Json) -> Response:
    awaited, awaiter = req["awaited"], req["awaiter"]
    if awaited == awaiter:
        return refuse(400)
    a = s.read_promise(awaited)
    if a is None:
        return refuse(404)
    w = s.read_promise(awaiter)
    if w is None:
        return refuse(422)
    if not targeted(w.tags):
        return refuse(422)
    if not external(a.tags):
        return refuse(422)
    if a.state == PENDING and w.state == PENDING:
        s.set_promise(replace(a, callbacks=add_once(a.callbacks, awaiter)))
    return ok({"promise": a.record()})


def p05_promise_register_listener(s: Step, req: Json) -> Response:
    if not address_valid(req["address"]):
        return refuse(400)
    a = s.read_promise(req["awaited"])
    if a is None:
        return refuse(404)
    if not external(a.tags):
        return refuse(422)
    if a.state == PENDING:
        s.set_promise(replace(a, listeners=add_once(a.listeners, req["address"])))
    return ok({"promise": a.record()})


def page(items: list[Any], key: Callable[[Any], str], req: Json, default: int) -> Json | None:
    """troth: id order, ``limit`` 1..1000, a cursor after the last id of a full page
    (the model's cursor is that id; troth's is opaque)."""
    limit = req.get("limit")
    limit = default if limit is None else limit
    if not 1 <= limit <= 1000:
        return None
    cursor = req.get("cursor")
    items = sorted(items, key=key)
    if cursor is not None:
        items = [x for x in items if key(x) > cursor]
    out = items[:limit]
    result: Json = {"items": out}
    if len(out) == limit:
        result["cursor"] = key(out[-1])
    return result


def p06_promise_search(s: Step, req: Json) -> Response:
    """troth: served (SPEC.md says 501); ``state`` on the projected state, every
    ``tags`` pair present (docs/protocol.md "Searches are served")."""
    state = req.get("state")
    if state is not None and state not in PROMISE_STATES:
        return refuse(400)
    want: Tags = req.get("tags") or {}
    found = [project(p, s.now) for p in s.state.promises]
    found = [
        p
        for p in found
        if (state is None or p.state == state) and all(p.tags.get(k) == v for k, v in want.items())
    ]
    result = page(found, lambda p: p.id, req, 100)
    if result is None:
        return refuse(400)
    out: Json = {"promises": [p.record() for p in result["items"]]}
    if "cursor" in result:
        out["cursor"] = result["cursor"]
    return ok(out)


# ---------------------------------------------------------------------- §4.2 tasks


def t01_task_get(s: Step, req: Json) -> Response:
    t, p = s.read_task(req["id"])
    if t is None or p is None:
        return refuse(404)
    return ok({"task": t.record()})


def t02_task_create(s: Step, req: Json) -> Response:
    c = action_of(req["action"], ("promise.create",))
    if c is None:
        return refuse(400)
    tags: Tags = dict(c.get("tags") or {})
    if not targeted(tags) or timer_targeted(tags):
        return refuse(400)
    if reserved(c["id"]):
        return refuse(400)
    now, ttl, pid = s.now, req["ttl"], req["pid"]
    p = s.read_promise(c["id"])
    if p is None:
        param = Value.of(c.get("param"))
        if c["timeoutAt"] > now:
            p = Promise(c["id"], PENDING, param, EMPTY, tags, c["timeoutAt"], created_at=now)
            t = Task(c["id"], ACQUIRED, 1, ttl=ttl, pid=pid, expires_at=now + ttl)
            s.set_promise(p)
            s.set_task(t)
        else:
            p = s.create_promise(c["id"], c["timeoutAt"], param, tags)
            t = Task(c["id"], FULFILLED, 0)
        return ok({"task": t.record(), "promise": p.record(), "preload": Preload(p.id)})
    if not targeted(p.tags):
        return refuse(422)
    task, _ = s.read_task(c["id"])
    if task is None:
        return refuse(409)
    if task.state == FULFILLED:
        return ok({"task": task.record(), "promise": p.record(), "preload": Preload(p.id)})
    if task.state == PENDING:
        u = replace(
            task,
            state=ACQUIRED,
            version=task.version + 1,
            ttl=ttl,
            pid=pid,
            expires_at=now + ttl,
            retry_at=None,
            resumes=(),
        )
        s.set_task(u)
        return ok({"task": u.record(), "promise": p.record(), "preload": Preload(p.id)})
    return refuse(409)


def held(s: Step, id: str, version: int, state: str) -> tuple[Task, Promise] | Response:
    """The common guard of the versioned task calls: 404, 409 (promise absent), then
    state, liveness and version, each 409."""
    t, p = s.read_task(id)
    if t is None:
        return refuse(404)
    if p is None:
        return refuse(409)
    if t.state != state or p.state != PENDING or t.version != version:
        return refuse(409)
    return t, p


def t03_task_acquire(s: Step, req: Json) -> Response:
    got = held(s, req["id"], req["version"], PENDING)
    if isinstance(got, Response):
        return got
    t, p = got
    now = s.now
    u = replace(
        t,
        state=ACQUIRED,
        version=t.version + 1,
        ttl=req["ttl"],
        pid=req["pid"],
        expires_at=now + req["ttl"],
        retry_at=None,
        resumes=(),
    )
    s.set_task(u)
    return ok({"task": u.record(), "promise": p.record(), "preload": Preload(p.id)})


def t04_task_fence(s: Step, req: Json) -> Response:
    action = req["action"]
    inner = action_of(action, ("promise.create", "promise.settle"))
    if inner is None:
        return refuse(400)
    if inner.get("id") == req["id"]:
        return refuse(400)
    got = held(s, req["id"], req["version"], ACQUIRED)
    if isinstance(got, Response):
        return got
    if action["kind"] == "promise.create":
        res = p02_promise_create(s, inner, fenced=True)
    else:
        res = p03_promise_settle(s, inner)
    wrapped = {"kind": action["kind"], "head": {"status": res.status}, "data": res.data}
    # troth: a fence's preload is empty (docs/protocol.md "preload").
    return ok({"action": wrapped, "preload": []})


def t05_task_heartbeat(s: Step, req: Json) -> Response:
    for ref in req.get("tasks") or []:
        t, p = s.read_task(ref["id"])
        if (
            t is not None
            and p is not None
            and t.state == ACQUIRED
            and t.version == ref["version"]
            and t.pid == req["pid"]
            and p.state == PENDING
        ):
            assert t.ttl is not None
            s.set_task(replace(t, expires_at=s.now + t.ttl))
    return ok({})


def t06_task_suspend(s: Step, req: Json) -> Response:
    actions = req["actions"]
    if not actions:
        return refuse(400)
    callbacks = [action_of(a, ("promise.register_callback",)) for a in actions]
    if any(c is None for c in callbacks):
        return refuse(400)
    awaited = [c["awaited"] for c in callbacks if c is not None]
    if req["id"] in awaited or len(set(awaited)) != len(awaited):
        return refuse(400)
    got = held(s, req["id"], req["version"], ACQUIRED)
    if isinstance(got, Response):
        return got
    t, p = got
    targets: list[Promise] = []
    for id in awaited:
        q = s.read_promise(id)
        if q is None or not external(q.tags):
            return refuse(422)
        targets.append(q)
    if any(q.state != PENDING for q in targets):
        s.set_task(replace(t, resumes=()))
        return Response(300, {"preload": Preload(p.id)})
    for q in targets:
        s.set_promise(replace(q, callbacks=add_once(q.callbacks, t.id)))
    s.set_task(
        replace(t, state=SUSPENDED, pid=None, ttl=None, expires_at=None, retry_at=None, resumes=())
    )
    return ok({})


def t07_task_fulfill(s: Step, req: Json) -> Response:
    settle = action_of(req["action"], ("promise.settle",))
    if settle is None or not settable(settle["state"]):
        return refuse(400)
    got = held(s, req["id"], req["version"], ACQUIRED)
    if isinstance(got, Response):
        return got
    _, p = got  # the task's own promise: the action's id is not consulted
    q = replace(p, state=settle["state"], value=Value.of(settle.get("value")), settled_at=s.now)
    s.set_settled(q)
    return ok({"promise": q.record()})


def t08_task_release(s: Step, req: Json) -> Response:
    got = held(s, req["id"], req["version"], ACQUIRED)
    if isinstance(got, Response):
        return got
    t, _ = got
    s.set_task(replace(t, state=PENDING, pid=None, ttl=None, expires_at=None, retry_at=s.now))
    return ok({})


def t09_task_halt(s: Step, req: Json) -> Response:
    t, p = s.read_task(req["id"])
    if t is None or p is None:
        return refuse(404)
    if t.state == FULFILLED:
        return refuse(409)
    if t.state == HALTED:
        return ok({})
    s.set_task(replace(t, state=HALTED, pid=None, ttl=None, expires_at=None, retry_at=None))
    return ok({})


def t10_task_continue(s: Step, req: Json) -> Response:
    t, p = s.read_task(req["id"])
    if t is None:
        return refuse(404)
    if t.state != HALTED:
        return refuse(409)
    if p is None:
        return refuse(404)
    if p.state != PENDING:
        return refuse(409)
    s.set_task(replace(t, state=PENDING, retry_at=s.now))
    return ok({})


def t11_task_search(s: Step, req: Json) -> Response:
    """troth: served; ``state`` on the viewed state (docs/protocol.md)."""
    state = req.get("state")
    if state is not None and state not in TASK_STATES:
        return refuse(400)
    found: list[Task] = []
    for t in s.state.tasks:
        p = s.state.promise(t.id)
        u = t if p is None else view(t, project(p, s.now))
        if state is None or u.state == state:
            found.append(u)
    result = page(found, lambda t: t.id, req, 100)
    if result is None:
        return refuse(400)
    out: Json = {"tasks": [t.record() for t in result["items"]]}
    if "cursor" in result:
        out["cursor"] = result["cursor"]
    return ok(out)


# ---------------------------------------------------------------------- §4.3 schedules

# troth's calendar is its own (docs/protocol.md "Schedules"); the model knows only the
# few periodic expressions the differential uses, and which others troth refuses.
CRON_PERIODS = {
    "* * * * * *": 1000,
    "*/10 * * * * *": 10_000,
    "*/30 * * * * *": 30_000,
    "* * * * *": 60_000,
}
CRON_INVALID = ("bad", "61 * * * * *", "*/10 * * *", "")


def next_cron(cron: str, after: int) -> int:
    """``nextCron``: the first occurrence strictly after ``after`` (UTC, epoch-aligned
    for these periods)."""
    period = CRON_PERIODS[cron]
    return (after // period + 1) * period


def expand(template: str, schedule_id: str, t: int) -> str:
    """troth: occurrence ids are ``~{scheduleId}/{template}`` with ``{{.id}}`` and
    ``{{.timestamp}}`` substituted, so no client can forge one."""
    body = template.replace("{{.id}}", schedule_id).replace("{{.timestamp}}", str(t))
    return f"~{schedule_id}/{body}"


def occurrence_tags(c: Schedule, id: str) -> Tags:
    """troth: ``promiseTags`` + ``resonate:schedule``, and lineage tags unless given."""
    tags = dict(c.promise_tags)
    tags["resonate:schedule"] = c.id
    for k in ("resonate:origin", "resonate:branch", "resonate:parent"):
        tags.setdefault(k, id)
    return tags


def s01_schedule_get(s: Step, req: Json) -> Response:
    c = s.state.schedule(req["id"])
    if c is None:
        return refuse(404)
    return ok({"schedule": c.record()})


def s02_schedule_create(s: Step, req: Json) -> Response:
    tags: Tags = dict(req.get("promiseTags") or {})
    if timer_targeted(tags):
        return refuse(400)
    if req["cron"] not in CRON_PERIODS:
        if req["cron"] in CRON_INVALID:
            return refuse(400)
        raise NotImplementedError(f"the model has no calendar for {req['cron']!r}")
    if "/" in req["id"] or "{{.timestamp}}" not in req["promiseId"]:
        return refuse(400)  # troth: occurrence ids must be distinct
    c = s.state.schedule(req["id"])
    if c is not None:
        return ok({"schedule": c.record()})
    c = Schedule(
        req["id"],
        req["cron"],
        req["promiseId"],
        req["promiseTimeout"],
        Value.of(req.get("promiseParam")),
        tags,
        created_at=s.now,
        next_run_at=next_cron(req["cron"], s.now),
    )
    s.set_schedule(c)
    return ok({"schedule": c.record()})


def s03_schedule_delete(s: Step, req: Json) -> Response:
    if s.state.schedule(req["id"]) is None:
        return refuse(404)
    s.del_schedule(req["id"])
    return ok({})


def s04_schedule_search(s: Step, req: Json) -> Response:
    """troth: served; ``tags`` filters the ``promiseTags``; 10 a page by default."""
    want: Tags = req.get("tags") or {}
    found = [
        c for c in s.state.schedules if all(c.promise_tags.get(k) == v for k, v in want.items())
    ]
    result = page(found, lambda c: c.id, req, 10)
    if result is None:
        return refuse(400)
    out: Json = {"schedules": [c.record() for c in result["items"]]}
    if "cursor" in result:
        out["cursor"] = result["cursor"]
    return ok(out)


REQUESTS: dict[str, Callable[[Step, Json], Response]] = {
    "promise.get": p01_promise_get,
    "promise.create": p02_promise_create,
    "promise.settle": p03_promise_settle,
    "promise.register_callback": p04_promise_register_callback,
    "promise.register_listener": p05_promise_register_listener,
    "promise.search": p06_promise_search,
    "task.get": t01_task_get,
    "task.create": t02_task_create,
    "task.acquire": t03_task_acquire,
    "task.fence": t04_task_fence,
    "task.heartbeat": t05_task_heartbeat,
    "task.suspend": t06_task_suspend,
    "task.fulfill": t07_task_fulfill,
    "task.release": t08_task_release,
    "task.halt": t09_task_halt,
    "task.continue": t10_task_continue,
    "task.search": t11_task_search,
    "schedule.get": s01_schedule_get,
    "schedule.create": s02_schedule_create,
    "schedule.delete": s03_schedule_delete,
    "schedule.search": s04_schedule_search,
}


# ---------------------------------------------------------------------- §5 internal steps

StepName = tuple[Any, ...]  # ("r1", id) ("r3", id, address) ("r4", id, awaiter) ("r5", id) …


def r1_process_promise_timeout(s: Step, id: str) -> None:
    p = s.state.promise(id)
    if p is not None and p.state == PENDING and p.timeout_at <= s.now:
        s.touch_promise(id)  # persists Fact P; setSettled fulfils the task


def r3_process_listener(s: Step, id: str, address: str) -> None:
    p = s.view_promise(id)
    if p is None or p.state == PENDING or address not in p.listeners:
        return
    p = s.touch_promise(id)
    assert p is not None
    s.set_promise(replace(p, listeners=tuple(a for a in p.listeners if a != address)))
    s.set_message(address, Unblock(p.without_ledgers()))


def r4_process_callback(s: Step, id: str, awaiter: str) -> None:
    p = s.view_promise(id)
    if p is None or p.state == PENDING or awaiter not in p.callbacks:
        return
    p = s.touch_promise(id)
    assert p is not None
    s.set_promise(replace(p, callbacks=tuple(x for x in p.callbacks if x != awaiter)))
    resume_one(s, id, awaiter)


def resume_one(s: Step, awaited: str, awaiter: str) -> None:
    """Wake or buffer the awaiter, after materialising its own deadline (C6)."""
    t, p = s.touch_task(awaiter)
    if t is None or p is None:
        return  # absent
    if t.state == SUSPENDED:
        s.set_task(replace(t, state=PENDING, resumes=(awaited,), retry_at=s.now))
    elif t.state in (PENDING, ACQUIRED, HALTED):
        if awaited not in t.resumes:
            s.set_task(replace(t, resumes=(*t.resumes, awaited)))
    # fulfilled (including by its own deadline): timeout always wins, nothing


def r5_process_lease_timeout(s: Step, id: str) -> None:
    t = s.state.task(id)
    p = s.view_promise(id)
    if t is None or p is None:
        return
    if t.state == ACQUIRED and t.expires_at is not None and t.expires_at <= s.now:
        if p.state == PENDING:
            s.set_task(
                replace(t, state=PENDING, pid=None, ttl=None, expires_at=None, retry_at=s.now)
            )


def r6_process_retry_timeout(s: Step, id: str) -> None:
    t = s.state.task(id)
    p = s.view_promise(id)
    if t is None or p is None:
        return
    if t.state == PENDING and t.retry_at is not None and t.retry_at <= s.now:
        if p.state == PENDING:
            s.set_task(replace(t, retry_at=s.now + RETRY_TIMEOUT))
            s.set_message(p.tags.get(TARGET, ""), Execute(id, t.version))


def r7_process_schedule(s: Step, id: str) -> None:
    """Catch-up: every missed occurrence, each created as if at its own instant."""
    c = s.state.schedule(id)
    if c is None:
        return
    instants: list[int] = []
    t = c.next_run_at
    while t <= s.now:
        instants.append(t)
        t = next_cron(c.cron, t)
    for t in instants:
        oid = expand(c.promise_id, c.id, t)
        if s.state.promise(oid) is None:  # createIfAbsent
            tags = occurrence_tags(c, oid)
            s.create_promise(oid, t + c.promise_timeout, c.promise_param, tags, now=t)
    if instants:
        last = instants[-1]
        s.set_schedule(replace(c, last_run_at=last, next_run_at=next_cron(c.cron, last)))


def enabled(state: State, now: int) -> list[StepName]:
    """``enabledInternal``: every internal step whose guard holds at ``now``."""
    out: list[StepName] = []
    for c in state.schedules:
        if c.next_run_at <= now:
            out.append(("r7", c.id))
    for p in state.promises:
        if p.state == PENDING and p.timeout_at <= now:
            out.append(("r1", p.id))
        if project(p, now).state != PENDING:
            out += [("r3", p.id, a) for a in p.listeners]
            out += [("r4", p.id, x) for x in p.callbacks]
    for t in state.tasks:
        own = state.promise(t.id)
        live = own is not None and project(own, now).state == PENDING
        if live and t.state == ACQUIRED and t.expires_at is not None and t.expires_at <= now:
            out.append(("r5", t.id))
        if live and t.state == PENDING and t.retry_at is not None and t.retry_at <= now:
            out.append(("r6", t.id))
    return out


INTERNAL: dict[str, Callable[..., None]] = {
    "r1": r1_process_promise_timeout,
    "r3": r3_process_listener,
    "r4": r4_process_callback,
    "r5": r5_process_lease_timeout,
    "r6": r6_process_retry_timeout,
    "r7": r7_process_schedule,
}


# ---------------------------------------------------------------------- the driver


@dataclass(frozen=True)
class Transition:
    """One step of the machine: what fired, and the state after it."""

    label: StepName
    state: State
    internal: bool


def handle(state: State, kind: str, req: Json, now: int) -> tuple[Response, State]:
    """One client request as one step (no internal steps)."""
    s = Step(state, now)
    response = REQUESTS[kind](s, req)
    after = apply(state, s.writes)
    if response.data is not None and isinstance(response.data.get("preload"), Preload):
        filled = response.data["preload"].resolve(after, now)
        response = replace(response, data={**response.data, "preload": filled})
    return response, after


def fire(state: State, name: StepName, now: int) -> State:
    """One internal step (silent); a no-op when its guard does not hold."""
    s = Step(state, now, mat=True)
    INTERNAL[name[0]](s, *name[1:])
    return apply(state, s.writes)


def written_rows(before: State, after: State) -> set[tuple[str, str]]:
    """The rows a step replaced, as ``("promise", id)`` / ``("task", id)``."""
    rows = {("promise", p.id) for p in after.promises if before.promise(p.id) != p}
    return rows | {("task", t.id) for t in after.tasks if before.task(t.id) != t}


def subject(name: StepName) -> tuple[str, str]:
    """The row an internal step's guard reads first: r1/r3/r4 a promise, r5/r6 a task."""
    return ("task" if name[0] in ("r5", "r6") else "promise", name[1])


def quiesce(
    state: State, now: int, due: Callable[[StepName, State], bool], written: set[tuple[str, str]]
) -> list[Transition]:
    """troth's transaction after its first write: fire, one at a time and in
    ``enabled``'s fixed order, every enabled step that is ``due`` or whose row was
    written in this transaction (by the request or by a step fired before it), until
    none is left."""
    chain: list[Transition] = []
    written = set(written)
    while True:
        steps = [n for n in enabled(state, now) if subject(n) in written or due(n, state)]
        if not steps:
            return chain
        after = fire(state, steps[0], now)
        if after == state:  # pragma: no cover - an enabled step always writes
            raise AssertionError(f"enabled step {steps[0]} wrote nothing")
        written |= written_rows(state, after)
        chain.append(Transition(steps[0], after, internal=True))
        state = after


def after_request(
    state: State, kind: str, req: Json, now: int
) -> tuple[Response, list[Transition]]:
    """troth's schedule (docs/protocol.md "Internal steps fire at once"): the request,
    then, in the same transaction, every internal step enabled on a row it wrote, and
    on the rows those steps write, to quiescence.  So a settle drains its listeners
    (r3) and callbacks (r4), a task entering ``pending`` with ``retryAt = now`` is
    dispatched (r6), a lease granted with ``ttl = 0`` expires at once (r5).  A step
    already due on a row the request did not write (a promise's listener registered,
    its task untouched) waits for the timer."""
    response, after = handle(state, kind, req, now)
    request = Transition(("request", kind), after, internal=False)
    chain = quiesce(after, now, lambda name, current: False, written_rows(state, after))
    acquiring = req.get("id") if kind == "task.acquire" else None
    gated = gate(state, [request, *chain], now, acquiring)
    if gated is None:
        return refuse(409), []
    return response, gated


def timer_allows(name: StepName, state: State) -> bool:
    """troth's timer index holds every deadline except an internal promise's: such a
    promise has no task and no ledgers, so persisting its timeout would change nothing
    a client can see, and reads project it (docs/protocol.md "Reads are projected")."""
    if name[0] == "r1":
        p = state.promise(name[1])
        return p is not None and external(p.tags)
    return True


def tick(state: State, now: int) -> list[Transition]:
    """troth's timer at ``now`` (``debug.tick``): every step due on its index
    (``timer_allows``) and every step enabled on a row those write, to quiescence —
    so r1 also fires on an internal schedule occurrence that r7 created already past
    its deadline.  troth: with a limit set, the gate follows the timer's pass."""
    chain = quiesce(state, now, timer_allows, set())
    gated = gate(state, chain, now)
    assert gated is not None  # only a task.acquire is refused
    return gated


# ---------------------------------------------------------------------- troth: flow control

PRIORITY = "troth:priority"
KEY = "troth:key"


def group_of(address: str) -> str | None:
    """troth: what a limit is named by (docs/operations.md "Flow control"): the group
    of ``poll://any@GROUP`` or ``poll://uni@GROUP/…``, or the push target
    ``scheme://host[:port]`` (lower case, no path) of an ``http(s)://`` address."""
    if address.startswith("poll://") and "@" in address:
        group = address.split("@", 1)[1].split("/", 1)[0]
        return group or None
    for scheme in ("http://", "https://"):
        if address.lower().startswith(scheme):
            host = address[len(scheme) :].split("/", 1)[0].lower()
            return scheme + host if host else None
    return None


#: troth: a priority beyond ±(2**31 - 1) counts as that bound (docs/operations.md).
PRIORITY_BOUND = 2**31 - 1


def priority_of(tags: Tags) -> int:
    """troth: ``troth:priority``, an integer as a string (ASCII digits, an optional
    ``-``), default 0 (so is anything else), bounded at ±(2**31 - 1)."""
    text = tags.get(PRIORITY, "0")
    if not (text.removeprefix("-").isascii() and text.removeprefix("-").isdigit()):
        return 0
    return max(-PRIORITY_BOUND, min(PRIORITY_BOUND, int(text)))


def set_limit(state: State, limit: Limit) -> State:
    """troth: a **new** limit counts the group's tasks acquired at that moment (the
    model sets limits before a script's first task only, so the count is 0 there)."""
    flow = state.flow
    slots = list(flow.slots)
    if flow.limit(limit.group) is None:
        for t in state.tasks:
            p = state.promise(t.id)
            if t.state == ACQUIRED and p is not None and flow.slot(t.id) is None:
                if group_of(p.tags.get(TARGET, "")) == limit.group:
                    slots.append((t.id, limit.group, p.tags.get(KEY, "")))
    limits = (*(x for x in flow.limits if x.group != limit.group), limit)
    # "a changed rate or burst starts with a full bucket" (a new one too)
    was = flow.limit(limit.group)
    fresh = was is None or (was.rate, was.burst) != (limit.rate, limit.burst)
    tats = tuple((g, t) for g, t in flow.tats if g != limit.group or not fresh)
    return replace(state, flow=replace(flow, limits=limits, slots=tuple(slots), tats=tats))


class Gate:
    """The flow-control step after one job (a request and the internal steps it
    enabled, or one timer pass), over the job's net change ``before`` → ``after``:

    * a task that became acquired takes a slot (``task.create`` even beyond the
      limit); a ``task.acquire`` of a task holding none while its group has no slot
      free, its key is at ``perKey``, or a held task comes before it, is refused: 409,
      and the job changes nothing;
    * a task that leaves ``acquired`` or ``pending`` (fulfilled, released, suspended,
      halted, lease expired, settled otherwise) frees its slot; a pending task whose
      ``execute`` is sent again (the retry timer) keeps it;
    * an ``execute`` written for a task of a limited group that holds no slot is not
      sent: troth: it is taken out of the outbox (with delivery paused, as in the
      differential, every row is unsent) and its task queued, one turn past the last
      held task of its key and past the last let through, or at the place it has;
    * then each group whose slots or queue changed lets held tasks through in queue
      order while slots are free, passing over those whose key is at ``perKey``: each
      gets its ``execute`` in the same job and a slot;
    * under a rate limit every start (a task let through, or acquired without having
      been) takes a token; admission stops at the first task without one and moves
      its ``retryAt`` to the token's time; ``task.acquire`` without a token is 409.
    """

    def __init__(self, before: State, after: State, now: int) -> None:
        self.before, self.state, self.now = before, after, now
        flow = after.flow
        self.slots = {id: (g, k) for id, g, k in flow.slots}
        self.held = {h.task_id: h for h in flow.held}
        self.turns = dict(flow.turns)
        self.tats = dict(flow.tats)
        self.outbox = {e.key: e for e in after.outbox}

    def done(self) -> State:
        flow = replace(
            self.state.flow,
            slots=tuple((id, g, k) for id, (g, k) in self.slots.items()),
            held=tuple(self.held.values()),
            turns=tuple(self.turns.items()),
            tats=tuple(self.tats.items()),
        )
        return replace(self.state, outbox=tuple(self.outbox.values()), flow=flow)

    def group(self, id: str) -> tuple[Limit | None, Promise | None]:
        p = self.state.promise(id)
        if p is None:
            return None, None
        return self.state.flow.limit(group_of(p.tags.get(TARGET, ""))), p

    def key_in_use(self, group: str, key: str) -> int:
        return sum(1 for g, k in self.slots.values() if g == group and k == key)

    def in_use(self, group: str) -> int:
        return sum(1 for g, _ in self.slots.values() if g == group)

    def queue(self, group: str) -> list[Held]:
        return sorted((h for h in self.held.values() if h.group == group), key=Held.place)

    def refused(self, id: str, limit: Limit, key: str) -> bool:
        """docs/protocol.md "Concurrency limits": no slot free, or tasks queued before
        it wait; docs/operations.md: its key at ``perKey``."""
        group = limit.group
        if limit.concurrency is not None and self.in_use(group) >= limit.concurrency:
            return True
        if limit.per_key is not None and self.key_in_use(group, key) >= limit.per_key:
            return True
        if limit.rate is not None and limit.next_start(self.tats.get(group, 0.0)) > self.now:
            return True  # no token: "A task.acquire without a token gets 409"
        waiting = [
            h
            for h in self.queue(group)
            if limit.per_key is None or self.key_in_use(group, h.key) < limit.per_key
        ]
        return bool(waiting) and waiting[0].task_id != id

    def keep(self, executes: set[str], acquiring: str | None) -> State | None:
        """The gated state, or None for a refused ``task.acquire`` of ``acquiring``."""
        touched: set[str] = set()
        written = {t.id for t in self.state.tasks if self.before.task(t.id) != t}
        for id in sorted(written | executes, key=self.created):
            t = self.state.task(id)
            limit, p = self.group(id)
            if t is None or p is None or limit is None:
                continue
            old = self.before.task(id)
            was = None if old is None else old.state
            if was == ACQUIRED and t.state == ACQUIRED:
                continue  # a heartbeat, a fence: its slot stays
            key = p.tags.get(KEY, "")
            if t.state == ACQUIRED:
                if id in self.slots:
                    continue
                if id == acquiring and self.refused(id, limit, key):
                    return None
                if limit.rate is not None:  # a start; task.create's even in debt
                    self.tats[limit.group] = limit.take(self.tats.get(limit.group, 0.0), self.now)
                self.slots[id] = (limit.group, key)
                self.held.pop(id, None)
                continue
            if id in self.slots:
                if t.state == PENDING and was == PENDING:
                    continue  # its execute sent again: no worker has it yet
                del self.slots[id]
                touched.add(limit.group)
            if t.state != PENDING:
                self.held.pop(id, None)
            if id in executes and t.state == PENDING:
                entry = self.outbox.pop(id)
                self.held[id] = self.place(id, limit.group, entry.address, p, key)
                touched.add(limit.group)
        for group in sorted(touched):
            limit = self.state.flow.limit(group)
            assert limit is not None
            self.admit(limit)
        return self.done()

    def created(self, id: str) -> tuple[int, str]:
        """troth: tasks queued in one job (a timer pass: schedule occurrences, expired
        leases) take their turns first created, first queued ("then first created")."""
        p = self.state.promise(id)
        return (0 if p is None else p.created_at, id)

    def place(self, id: str, group: str, address: str, p: Promise, key: str) -> Held:
        """A task re-offered while held keeps its place; otherwise troth: one turn past
        the last held task of its key and past the group's last let through."""
        kept = self.held.get(id)
        if kept is not None and kept.group == group:
            return replace(kept, address=address)
        mine = [h.turn for h in self.held.values() if h.group == group and h.key == key]
        turn = max([self.turns.get(group, 0), *mine]) + 1
        return Held(id, group, address, priority_of(p.tags), p.created_at, key, turn)

    def admit(self, limit: Limit) -> None:
        group = limit.group
        free = None if limit.concurrency is None else limit.concurrency - self.in_use(group)
        for h in self.queue(group):
            if free is not None and free <= 0:
                break
            t = self.state.task(h.task_id)
            p = self.state.promise(h.task_id)
            if (
                t is None
                or t.state != PENDING
                or p is None
                or project(p, self.now).state != PENDING
                or h.task_id in self.slots
            ):
                del self.held[h.task_id]  # no longer waiting
                continue
            if limit.per_key is not None and self.key_in_use(group, h.key) >= limit.per_key:
                continue  # passed over, keeping its place
            if limit.rate is not None:
                tat = self.tats.get(group, 0.0)
                at = limit.next_start(tat)
                if at > self.now:
                    # "the first held task's retry time moves to when its token
                    # comes" (troth: ms rounded up; never later than it was)
                    due = math.ceil(at)
                    if t.retry_at is None or t.retry_at > due:
                        self.state = apply(self.state, [("task", replace(t, retry_at=due))])
                    break
                self.tats[group] = limit.take(tat, self.now)
            del self.held[h.task_id]
            self.outbox[h.task_id] = Entry(h.address, Execute(t.id, t.version))
            self.slots[h.task_id] = (group, h.key)
            self.turns[group] = max(self.turns.get(group, 0), h.turn)
            if free is not None:
                free -= 1


def gate(
    before: State, chain: list[Transition], now: int, acquiring: str | None = None
) -> list[Transition] | None:
    """troth: one job's chain with the flow-control step after it (a ``("gate",)``
    transition when it changed anything), or None when the job is refused."""
    if not before.flow.limits or not chain:
        return chain
    executes = {t.label[1] for t in chain if t.label[0] == "r6"}
    after = Gate(before, chain[-1].state, now).keep(executes, acquiring)
    if after is None:
        return None
    if after != chain[-1].state:
        chain = [*chain, Transition(("gate",), after, internal=False)]
    return chain
