"""The workloads, each driving the server over real HTTP and SSE and checking itself.

Every workload is a closed loop: each of the N clients waits for its answer before
it sends the next request, as SDK workers do, so the rate is what the server
sustains at that concurrency and the latency is what a client waits.  Each one
verifies what it did before its figures are kept: every promise it created is read
back (``promise.search`` by the run's tag) and must be in the state the workload put
it in, every task fulfilled exactly once, no acquisition granted twice.  A failed
check raises :class:`BenchFailure` and the run fails: a fast wrong answer is not a
result.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import msgspec

from troth.plural import counted
from troth_bench.client import (
    FAR,
    BenchFailure,
    Client,
    expect_state,
    promise_of,
    task_of,
)
from troth_bench.http import HttpConnection, SseConnection
from troth_bench.measure import DbPids, Probe, Recorder, Samples, Window
from troth_bench.nats import RECV, NatsClient, NatsRequests
from troth_bench.options import Options
from troth_bench.results import Result, Series

#: Tag that marks every promise of a run and workload, so the census can find them.
TAG = "troth-bench"
T = TypeVar("T")


@dataclass
class Ctx:
    """What every workload runs with: the server, the N clients, the options.

    ``nodes`` lists every troth process of the run (several on one PostgreSQL
    database with ``--nodes``); ``host``/``port`` is the first.  Clients, SSE
    workers and listeners are spread over the nodes round robin, so a request served
    by one node produces messages that another node's connection must carry."""

    host: str
    port: int
    opts: Options
    run: str  # unique per run: every id and tag starts with it
    clients: list[Client]
    spare: Client  # verification and stray-message checks, outside the N
    pid: int | list[int] | None  # the server's (every node's), when the bench started it
    metrics_url: tuple[str, int] | None = None  # where GET /metrics is read
    on_window: Callable[[str, Window], Coroutine[Any, Any, None]] | None = None  # profiler
    extra: list[Client] = field(default_factory=list)
    nodes: list[tuple[str, int]] = field(default_factory=list)
    db_pids: DbPids | None = None  # PostgreSQL's processes, charged to the run
    #: The NATS the servers use, and the connection the NATS workloads' requests share.
    nats_url: str | None = None
    nats_requests: NatsRequests | None = None

    def __post_init__(self) -> None:
        if not self.nodes:
            self.nodes = [(self.host, self.port)]

    def node(self, k: int) -> tuple[str, int]:
        """The node of the k-th connection of a kind (round robin)."""
        return self.nodes[k % len(self.nodes)]

    def tag(self, workload: str) -> str:
        return f"{self.run}/{workload}"

    async def more_clients(self, n: int) -> list[Client]:
        """``n`` connections: the N clients first, then extra ones opened once."""
        while len(self.clients) + len(self.extra) < n:
            k = len(self.extra)
            host, port = self.node(len(self.clients) + k)
            self.extra.append(await Client.open(host, port, f"{self.run}-x{k}"))
        return (self.clients + self.extra)[:n]

    async def metrics(self) -> dict[str, float]:
        """Counters of ``GET /metrics`` summed over labels and nodes (commit batches
        and jobs: with several nodes, the transactions of all of them)."""
        if self.metrics_url is None:
            return {}
        out: dict[str, float] = {}
        for host, port in self.nodes if len(self.nodes) > 1 else [self.metrics_url]:
            conn = await HttpConnection.open(host, port)  # idle ones get closed
            try:
                status, body = await conn.get("/metrics")
            finally:
                conn.close()
            if status != 200:
                continue
            for line in body.decode().splitlines():
                if not line or line.startswith("#"):
                    continue
                name, _, value = line.rpartition(" ")
                name = name.split("{", 1)[0]
                try:
                    out[name] = out.get(name, 0.0) + float(value)
                except ValueError:
                    continue
        return out


# -- helpers ---------------------------------------------------------------------------


def param(i: int) -> dict[str, Any]:
    """A realistic ``param``: base64 JSON of a function call, as the SDKs send."""
    call = b'{"func":"bench","args":[%d],"kwargs":{},"version":1}' % i
    return {"data": base64.b64encode(call).decode()}


async def parallel(
    clients: Sequence[Client], items: Sequence[T], fn: Callable[[Client, T], Awaitable[None]]
) -> None:
    """Run ``fn`` over ``items`` with every client busy (set-up and verification)."""
    it = iter(items)

    async def one(c: Client) -> None:
        for item in it:
            await fn(c, item)

    await asyncio.gather(*(one(c) for c in clients))


async def census(ctx: Ctx, workload: str) -> Counter[str]:
    """States of every promise tagged for ``workload``, read back through search."""
    counts: Counter[str] = Counter()
    seen: set[str] = set()
    cursor: str | None = None
    while True:
        data: dict[str, Any] = {"tags": {TAG: ctx.tag(workload)}, "limit": 1000}
        if cursor:
            data["cursor"] = cursor
        body, _ = await ctx.spare.ok("promise.search", data)
        for p in body["promises"]:
            if p["id"] in seen:
                raise BenchFailure(f"promise.search returned {p['id']} twice")
            seen.add(p["id"])
            counts[p["state"]] += 1
        cursor = body.get("cursor")
        if not cursor:
            return counts


async def expect_census(ctx: Ctx, workload: str, state: str, total: int) -> str:
    counts = await census(ctx, workload)
    if counts != Counter({state: total}):
        raise BenchFailure(
            f"{workload}: expected {total} promises {state}, the server holds {dict(counts)}"
        )
    return f"{total:,} promises read back {state}"


async def measured(
    ctx: Ctx,
    name: str,
    body: Callable[[Window, Recorder], Awaitable[None]],
    window: Window | None = None,
) -> tuple[Recorder, Probe]:
    """Run ``body`` under a fresh window and probe; fails when it hangs."""
    opts = ctx.opts
    if window is None:
        window = Window(opts.warmup, opts.duration)
        window.start()
    rec = Recorder(window)
    probe = Probe(
        window,
        ctx.pid,
        snapshot=ctx.metrics if ctx.metrics_url else None,
        db_pids=ctx.db_pids,
    )
    probe.start()
    hook = asyncio.create_task(ctx.on_window(name, window)) if ctx.on_window else None
    limit = max(0.0, window.end - time.perf_counter()) + 2 * opts.op_timeout
    try:
        await asyncio.wait_for(body(window, rec), limit)
    except TimeoutError:
        probe.cancel()
        raise BenchFailure(f"{name}: did not finish within {limit:.0f} s") from None
    except BaseException:
        probe.cancel()
        raise
    finally:
        if hook is not None:
            await hook
    await probe.finish()
    return rec, probe


def finish(
    name: str,
    headline: str,
    rec: Recorder,
    probe: Probe,
    lines: Sequence[tuple[str, str]],
    latency_only: Sequence[tuple[str, str]] = (),
) -> Result:
    seconds = rec.window.duration
    series = [Series.of(n, unit, rec.series.get(n, Samples()), seconds) for n, unit in lines]
    series += [Series.of(n, unit, rec.series.get(n, Samples()), None) for n, unit in latency_only]
    result = Result(name, headline, series, cpu=probe.cpu, rss_max=probe.rss_max)
    before, after = probe.snapshots
    batches = after.get("troth_commit_batches_total", 0) - before.get(
        "troth_commit_batches_total", 0
    )
    jobs = after.get("troth_commit_jobs_total", 0) - before.get("troth_commit_jobs_total", 0)
    if batches > 0 and probe.seconds > 0:
        result.commits_per_s = batches / probe.seconds
        result.jobs_per_commit = jobs / batches
    return result


async def timed(c: Client, rec: Recorder, kind: str, data: Any, expect: int = 200) -> Any:
    body, seconds = await c.ok(kind, data, expect)
    finished = c.read_at
    rec.add(kind, seconds, finished)
    rec.add("requests", seconds, finished)
    return body


# -- workers ---------------------------------------------------------------------------


class _Ref(msgspec.Struct):
    id: str
    version: int


class _ExecuteData(msgspec.Struct):
    task: _Ref


class _Push(msgspec.Struct):
    kind: str
    data: msgspec.Raw


_decode_push = msgspec.json.Decoder(_Push).decode
_decode_execute = msgspec.json.Decoder(_ExecuteData).decode


class WorkerPool:
    """SSE worker connections of one group (or, ``nats``, subscriptions to the group's
    anycast subject in the group's NATS queue group, as the SDKs' NATS connector
    subscribes).  Each ``execute`` goes to the waiter for its ``(task id, version)``;
    one nobody waits for (a duplicate) is acquired at once by the spare client, as a
    real worker would try, and that acquisition must fail."""

    def __init__(self, ctx: Ctx, group: str, count: int, *, nats: bool = False) -> None:
        self.ctx = ctx
        self.group = group
        self.count = count
        self.nats = nats
        self.nc: Any = None  # the workers' NATS connection
        self.conns: list[SseConnection] = []
        self.waiting: dict[tuple[str, int], asyncio.Future[tuple[float, str]]] = {}
        self.strays: list[tuple[str, int]] = []
        self.stray_granted: list[tuple[str, int]] = []
        self.received = 0
        self._checks: list[asyncio.Task[None]] = []
        self._lock = asyncio.Lock()

    @property
    def target(self) -> str:
        if self.nats:
            return f"nats://{RECV}.{self.group}"
        return f"poll://any@{self.group}"

    async def open(self) -> None:
        if self.nats:
            await self._subscribe()
            return
        for j in range(self.count):
            name = f"w{j}"
            host, port = self.ctx.node(j)
            conn = await SseConnection.open(
                host,
                port,
                f"/poll/{self.group}/{name}",
                functools.partial(self.on_message, name=name),
            )
            self.conns.append(conn)

    async def _subscribe(self) -> None:
        """``count`` queue subscriptions to ``{RECV}.{group}`` on one connection of the
        workers' own (NATS hands each message to one of them)."""
        import nats

        if self.ctx.nats_url is None:
            raise BenchFailure("NATS workers need the run's NATS (no nats_url)")
        self.nc = await nats.connect(self.ctx.nats_url, name="troth bench workers")
        subject = f"{RECV}.{self.group}"
        for j in range(self.count):
            name = f"w{j}"

            async def receive(msg: Any, name: str = name) -> None:
                self.on_message(msg.data, time.perf_counter(), name=name)

            await self.nc.subscribe(subject, queue=self.group, cb=receive)
        await self.nc.flush()

    def expect(self, id: str, version: int) -> asyncio.Future[tuple[float, str]]:
        fut: asyncio.Future[tuple[float, str]] = asyncio.get_running_loop().create_future()
        self.waiting[(id, version)] = fut
        return fut

    async def wait(self, fut: asyncio.Future[tuple[float, str]], id: str) -> tuple[float, str]:
        try:
            return await asyncio.wait_for(fut, self.ctx.opts.op_timeout)
        except TimeoutError:
            raise BenchFailure(
                f"no execute for task {id} within {self.ctx.opts.op_timeout:.0f} s"
            ) from None

    def on_message(self, payload: bytes, read_at: float, *, name: str) -> None:
        self.received += 1
        push = _decode_push(payload)
        if push.kind != "execute":
            self.strays.append((f"<{push.kind}>", -1))
            return
        ref = _decode_execute(push.data).task
        fut = self.waiting.pop((ref.id, ref.version), None)
        if fut is None or fut.done():
            self.strays.append((ref.id, ref.version))
            self._checks.append(asyncio.create_task(self._try_stray(ref.id, ref.version)))
            return
        fut.set_result((read_at, f"{self.group}-{name}"))

    async def _try_stray(self, id: str, version: int) -> None:
        async with self._lock:
            status, _, _ = await self.ctx.spare.call(
                "task.acquire", {"id": id, "version": version, "pid": "stray", "ttl": 60_000}
            )
        if status == 200:
            self.stray_granted.append((id, version))

    async def close(self) -> None:
        if self._checks:
            await asyncio.gather(*self._checks)
        for c in self.conns:
            c.close()
        if self.nc is not None:
            await self.nc.close()

    def check(self) -> list[str]:
        """Fail on an acquisition granted twice; report duplicates that were refused."""
        if self.stray_granted:
            raise BenchFailure(
                f"duplicate execute acquired a second time: {self.stray_granted[:5]}"
            )
        if self.waiting:
            raise BenchFailure(f"{len(self.waiting)} executes never arrived")
        return [f"{len(self.strays)} duplicate executes (every re-acquisition refused)"]


class Ledger:
    """Every acquisition the server granted: (task id, version) must be unique."""

    def __init__(self) -> None:
        self.granted: Counter[tuple[str, int]] = Counter()
        self.fulfilled: Counter[str] = Counter()

    def acquired(self, body: Any, id: str) -> int:
        task = task_of(body, "task.acquire")
        expect_state(task, "acquired", "acquired task")
        if task.get("id") != id:
            raise BenchFailure(f"task.acquire of {id} returned task {task.get('id')}")
        version: int = task["version"]
        self.granted[(id, version)] += 1
        if self.granted[(id, version)] > 1:
            raise BenchFailure(f"task {id} acquired twice at version {version}")
        return version

    def fulfil(self, body: Any, id: str) -> None:
        p = promise_of(body, "task.fulfill")
        expect_state(p, "resolved", "fulfilled task's promise")
        self.fulfilled[id] += 1
        if self.fulfilled[id] > 1:
            raise BenchFailure(f"task {id} fulfilled twice")


async def create_targeted(c: Client, rec: Recorder, id: str, n: int, tag: str, target: str) -> None:
    """A pending promise targeted at a worker group (its task gets an ``execute``)."""
    data = {
        "id": id,
        "timeoutAt": FAR,
        "param": param(n),
        "tags": {TAG: tag, "resonate:target": target},
    }
    p = promise_of(await timed(c, rec, "promise.create", data), "promise.create")
    expect_state(p, "pending", "created promise")


async def fulfil_timed(c: Client, rec: Recorder, ledger: Ledger, id: str, version: int) -> None:
    """``task.fulfill`` resolving the task's promise, timed and checked by the ledger."""
    ful = {"id": id, "version": version, "action": settle_action(id)}
    ledger.fulfil(await timed(c, rec, "task.fulfill", ful), id)


async def measured_with(
    ctx: Ctx, name: str, body: Callable[[Window, Recorder], Awaitable[None]], pool: WorkerPool
) -> tuple[Recorder, Probe]:
    """:func:`measured`, then close the workload's worker pool whatever happened."""
    try:
        return await measured(ctx, name, body)
    finally:
        await pool.close()


def settle_action(id: str) -> dict[str, Any]:
    return {
        "kind": "promise.settle",
        "head": {},
        "data": {"id": id, "state": "resolved", "value": {}},
    }


# -- create-settle ------------------------------------------------------------------------


async def create_settle(ctx: Ctx, name: str = "create-settle") -> Result:
    """``promise.create`` then ``promise.settle`` of unique ids: the plain write path."""
    tag = ctx.tag(name)
    infix = "cs" if name == "create-settle" else "csn"
    made = [0] * len(ctx.clients)

    async def body(window: Window, rec: Recorder) -> None:
        async def client(i: int, c: Client) -> None:
            n = 0
            while window.running:
                id = f"{ctx.run}-{infix}-{i}-{n}"
                n += 1
                data = {
                    "id": id,
                    "timeoutAt": FAR,
                    "param": param(n),
                    "tags": {TAG: tag, "resonate:scope": "global", "resonate:origin": id},
                }
                p = promise_of(await timed(c, rec, "promise.create", data), "promise.create")
                if p.get("id") != id:
                    raise BenchFailure(f"promise.create of {id} returned {p.get('id')}")
                expect_state(p, "pending", "created promise")
                settle = {"id": id, "state": "resolved", "value": {"data": "dHJ1ZQ=="}}
                p = promise_of(await timed(c, rec, "promise.settle", settle), "promise.settle")
                expect_state(p, "resolved", "settled promise")
                made[i] = n

        await asyncio.gather(*(client(i, c) for i, c in enumerate(ctx.clients)))

    rec, probe = await measured(ctx, name, body)
    result = finish(
        name,
        "requests",
        rec,
        probe,
        [("requests", "req"), ("promise.create", "req"), ("promise.settle", "req")],
    )
    result.checks.append(await expect_census(ctx, name, "resolved", sum(made)))
    return result


# -- reads ------------------------------------------------------------------------------------


async def reads(ctx: Ctx) -> Result:
    """``promise.get`` of existing ids, chosen at random among ``reads_ids`` it creates."""
    tag = ctx.tag("reads")
    ids = [f"{ctx.run}-rd-{k}" for k in range(ctx.opts.reads_ids)]

    async def create(c: Client, id: str) -> None:
        data = {"id": id, "timeoutAt": FAR, "param": param(0), "tags": {TAG: tag}}
        expect_state(promise_of((await c.ok("promise.create", data))[0], "create"), "pending", id)

    await parallel(ctx.clients, ids, create)
    result = await reads_of(ctx, ids, "pending")
    result.checks.append(await expect_census(ctx, "reads", "pending", len(ids)))
    return result


async def reads_of(ctx: Ctx, ids: Sequence[str], state: str) -> Result:
    """``promise.get`` of ids drawn at random from ``ids``, each expected in ``state``."""

    async def body(window: Window, rec: Recorder) -> None:
        async def client(i: int, c: Client) -> None:
            rng = random.Random(i)
            while window.running:
                id = ids[rng.randrange(len(ids))]
                p = promise_of(await timed(c, rec, "promise.get", {"id": id}), "promise.get")
                if p.get("id") != id:
                    raise BenchFailure(f"promise.get of {id} returned {p.get('id')}")
                expect_state(p, state, "read promise")

        await asyncio.gather(*(client(i, c) for i, c in enumerate(ctx.clients)))

    rec, probe = await measured(ctx, "reads", body)
    result = finish("reads", "promise.get", rec, probe, [("promise.get", "req")])
    result.checks.append(f"every read returned its promise, {state} ({len(ids):,} ids stored)")
    return result


# -- lifecycle ----------------------------------------------------------------------------------


async def lifecycle(
    ctx: Ctx, name: str = "lifecycle", *, nats: bool = False, infix: str | None = None
) -> Result:
    """Targeted ``promise.create`` → ``execute`` over SSE (``nats``: published to the
    workers' NATS subject) → ``task.acquire`` → ``task.fulfill``.  ``infix`` tells its
    ids and group from another run of it under another name."""
    tag = ctx.tag(name)
    infix = infix or ("lcn" if nats else "lc")
    pool = WorkerPool(ctx, f"{ctx.run}-{infix}", ctx.opts.workers, nats=nats)
    await pool.open()
    ledger = Ledger()
    made = [0] * len(ctx.clients)

    async def body(window: Window, rec: Recorder) -> None:
        async def client(i: int, c: Client) -> None:
            n = 0
            while window.running:
                id = f"{ctx.run}-{infix}-{i}-{n}"
                n += 1
                started = time.perf_counter()
                fut = pool.expect(id, 0)
                await create_targeted(c, rec, id, n, tag, pool.target)
                answered = c.read_at
                made[i] = n
                read_at, pid = await pool.wait(fut, id)
                rec.add("dispatch", read_at - answered, read_at)
                acq = {"id": id, "version": 0, "pid": pid, "ttl": 60_000}
                version = ledger.acquired(await timed(c, rec, "task.acquire", acq), id)
                await fulfil_timed(c, rec, ledger, id, version)
                rec.add("tasks", time.perf_counter() - started)

        await asyncio.gather(*(client(i, c) for i, c in enumerate(ctx.clients)))

    rec, probe = await measured_with(ctx, name, body, pool)
    result = finish(
        name,
        "tasks",
        rec,
        probe,
        [("tasks", "task"), ("requests", "req")],
        [("dispatch", "msg")],
    )
    total = sum(made)
    if len(ledger.fulfilled) != total:
        raise BenchFailure(f"{name}: {total} created, {len(ledger.fulfilled)} fulfilled")
    result.checks.append(await expect_census(ctx, name, "resolved", total))
    result.checks.append(f"{total:,} tasks acquired once and fulfilled once")
    result.checks += pool.check()
    result.notes.append(
        "dispatch = create answer read → execute read by the worker (both at the socket)"
        if not nats
        else "dispatch = create answer handed to the client → execute handed to the worker"
        " (both by nats-py's callbacks)"
    )
    return result


# -- fanout ----------------------------------------------------------------------------------------


async def fanout(ctx: Ctx) -> Result:
    """A task fences K targeted children, suspends on them; they are fulfilled, the
    parent is resumed (a second ``execute``), acquired again and fulfilled."""
    tag = ctx.tag("fanout")
    width = ctx.opts.children
    pool = WorkerPool(ctx, f"{ctx.run}-fo", ctx.opts.workers)
    await pool.open()
    ledger = Ledger()
    made = [0] * len(ctx.clients)

    async def body(window: Window, rec: Recorder) -> None:
        async def run_task(
            c: Client, id: str, fut: asyncio.Future[tuple[float, str]], version: int
        ) -> int:
            _, pid = await pool.wait(fut, id)
            acq = {"id": id, "version": version, "pid": pid, "ttl": 60_000}
            return ledger.acquired(await timed(c, rec, "task.acquire", acq), id)

        async def client(i: int, c: Client) -> None:
            n = 0
            while window.running:
                parent = f"{ctx.run}-fo-{i}-{n}"
                n += 1
                started = time.perf_counter()
                first = pool.expect(parent, 0)
                await create_targeted(c, rec, parent, n, tag, pool.target)
                made[i] = n
                version = await run_task(c, parent, first, 0)
                kids = [f"{parent}:{j}" for j in range(width)]
                waits = []
                for kid in kids:
                    waits.append(pool.expect(kid, 0))
                    create = {
                        "kind": "promise.create",
                        "head": {"corrId": f"{kid}-fence"},
                        "data": {
                            "id": kid,
                            "timeoutAt": FAR,
                            "param": param(n),
                            "tags": {TAG: tag, "resonate:target": pool.target},
                        },
                    }
                    fenced = await timed(
                        c, rec, "task.fence", {"id": parent, "version": version, "action": create}
                    )
                    inner = fenced.get("action", {})
                    if inner.get("head", {}).get("status") != 200:
                        raise BenchFailure(f"fenced create of {kid} answered {inner!r}")
                    expect_state(promise_of(inner.get("data"), "fence"), "pending", "child")
                resumed = pool.expect(parent, version)
                actions = [
                    {
                        "kind": "promise.register_callback",
                        "head": {},
                        "data": {"awaited": kid, "awaiter": parent},
                    }
                    for kid in kids
                ]
                await timed(
                    c, rec, "task.suspend", {"id": parent, "version": version, "actions": actions}
                )
                for kid, w in zip(kids, waits, strict=True):
                    kv = await run_task(c, kid, w, 0)
                    await fulfil_timed(c, rec, ledger, kid, kv)
                version = await run_task(c, parent, resumed, version)
                await fulfil_timed(c, rec, ledger, parent, version)
                rec.add("workflows", time.perf_counter() - started)

        await asyncio.gather(*(client(i, c) for i, c in enumerate(ctx.clients)))

    rec, probe = await measured_with(ctx, "fanout", body, pool)
    result = finish(
        "fanout",
        "workflows",
        rec,
        probe,
        [("workflows", "wf"), ("requests", "req")],
    )
    parents = sum(made)
    total = parents * (width + 1)
    if len(ledger.fulfilled) != total:
        raise BenchFailure(f"fanout: {total} tasks created, {len(ledger.fulfilled)} fulfilled")
    resumed = sum(1 for (id, v) in ledger.granted if v == 2 and ":" not in id)
    if resumed != parents:
        raise BenchFailure(f"fanout: {parents} parents, {resumed} resumed and re-acquired")
    result.checks.append(await expect_census(ctx, "fanout", "resolved", total))
    result.checks.append(
        f"{counted(parents, 'parent')} resumed once after {counted(width, 'child', 'children')};"
        f" {counted(total, 'task')} fulfilled once"
    )
    result.checks += pool.check()
    return result


# -- timers --------------------------------------------------------------------------------------


async def timers(ctx: Ctx) -> Result:
    """Timer promises with deadlines spread over ``timer_spread`` seconds; each has a
    listener, so the moment the server's timer settled it is the moment its
    ``unblock`` reaches the listener's SSE stream.  Lag = that moment − ``timeoutAt``."""
    opts = ctx.opts
    tag = ctx.tag("timers")
    group = f"{ctx.run}-tm"
    listeners = 4
    offset = time.time() - time.perf_counter()  # perf_counter → wall clock (ms math)
    arrived: dict[str, float] = {}
    states: Counter[str] = Counter()
    duplicates = [0]
    expected: dict[str, int] = {}

    def on_message(payload: bytes, read_at: float, *, name: str) -> None:
        push = _decode_push(payload)
        if push.kind != "unblock":
            return
        p = msgspec.json.decode(push.data)["promise"]
        id = p["id"]
        if id not in expected:
            return  # the calibration promises, settled below
        if id in arrived:
            duplicates[0] += 1
            return
        arrived[id] = read_at
        states[p["state"]] += 1
        if p.get("settledAt") != p.get("timeoutAt"):
            states["settledAt != timeoutAt"] += 1

    conns = [
        await SseConnection.open(
            *ctx.node(j),
            f"/poll/{group}/l{j}",
            functools.partial(on_message, name=f"l{j}"),
        )
        for j in range(listeners)
    ]
    addresses = [f"poll://uni@{group}/l{j}" for j in range(listeners)]

    async def arm(c: Client, item: tuple[str, int, int]) -> None:
        id, deadline, k = item
        data = {
            "id": id,
            "timeoutAt": deadline,
            "param": {},
            "tags": {TAG: tag, "resonate:timer": "true"},
        }
        p = promise_of((await c.ok("promise.create", data))[0], "promise.create")
        if p.get("state") != "pending":
            raise BenchFailure(f"timer {id} was already settled at creation: set-up too slow")
        listen = {"awaited": id, "address": addresses[k % listeners]}
        p = promise_of((await c.ok("promise.register_listener", listen))[0], "listener")
        if p.get("state") != "pending":
            raise BenchFailure(
                f"timer {id} fired before its listener was registered: set-up too slow"
            )

    try:
        # Calibrate: how fast can the timers be armed? Then start the first deadline
        # late enough that every listener is registered before any deadline.
        calib = [(f"{ctx.run}-tmc-{k}", FAR, k) for k in range(min(256, opts.timers))]
        t0 = time.perf_counter()
        await parallel(ctx.clients, calib, arm)
        per_timer = (time.perf_counter() - t0) / len(calib)
        budget = 1.0 + 2.0 * per_timer * opts.timers
        now_ms = int(time.time() * 1000)
        first = now_ms + int(budget * 1000)
        spread_ms = int(opts.timer_spread * 1000)
        items = [
            (f"{ctx.run}-tm-{k}", first + k * spread_ms // max(1, opts.timers - 1), k)
            for k in range(opts.timers)
        ]
        expected.update({id: d for id, d, _ in items})
        await parallel(ctx.clients, items, arm)
        last = items[-1][1]

        window = Window(0, 0)
        window.begin = first / 1000 - offset
        window.end = last / 1000 - offset + 0.5

        async def body(_window: Window, _rec: Recorder) -> None:
            deadline = time.perf_counter() + (last - time.time() * 1000) / 1000 + opts.op_timeout
            while len(arrived) < len(expected) and time.perf_counter() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(max(0.0, window.end - time.perf_counter()))

        rec, probe = await measured(ctx, "timers", body, window)

        async def settle_calibration(c: Client, item: tuple[str, int, int]) -> None:
            await c.ok("promise.settle", {"id": item[0], "state": "resolved", "value": {}})

        await parallel(ctx.clients, calib, settle_calibration)
    finally:
        for conn in conns:
            conn.close()
    missing = len(expected) - len(arrived)
    if missing:
        raise BenchFailure(f"timers: {missing} of {len(expected)} timeouts never became visible")
    if states != Counter({"resolved": len(expected)}):
        raise BenchFailure(f"timers: unexpected states {dict(states)}")
    lag = Samples([(at + offset) - expected[id] / 1000 for id, at in arrived.items()])
    result = finish("timers", "lag", rec, probe, [], [])
    result.series = [Series.of("lag", "timer", lag, None)]
    result.checks.append(f"{len(expected):,} timers resolved at their deadline, one unblock each")
    result.checks.append(f"{duplicates[0]} duplicate unblocks")
    result.notes.append(
        f"deadlines spread over {opts.timer_spread:g} s;"
        " lag = unblock read by the listener − timeoutAt"
    )
    return result


# -- heartbeat -----------------------------------------------------------------------------------


async def heartbeat(ctx: Ctx) -> Result:
    """``hb_tasks`` acquired tasks, heartbeated by ``hb_workers`` workers in a closed loop.

    The lease is shorter than the run, so a heartbeat that did not extend it would
    let the timer expire the task (back to pending, version unchanged): the check
    afterwards finds every task still acquired by its worker, and fulfils each one
    exactly once at the version it was born with."""
    opts = ctx.opts
    tag = ctx.tag("heartbeat")
    group = f"{ctx.run}-hb"
    ttl = int(min(max((opts.warmup + opts.duration) * 1000 / 3, 1000), 10_000))
    workers = [f"{group}-w{w}" for w in range(opts.hb_workers)]
    owned: dict[str, list[str]] = {w: [] for w in workers}
    ids = [f"{ctx.run}-hb-{k}" for k in range(opts.hb_tasks)]
    for k, id in enumerate(ids):
        owned[workers[k % len(workers)]].append(id)
    owner = {id: w for w, mine in owned.items() for id in mine}

    async def create(c: Client, id: str) -> None:
        action = {
            "kind": "promise.create",
            "head": {},
            "data": {
                "id": id,
                "timeoutAt": FAR,
                "param": param(0),
                "tags": {TAG: tag, "resonate:target": f"poll://any@{group}"},
            },
        }
        body, _ = await c.ok("task.create", {"pid": owner[id], "ttl": ttl, "action": action})
        task = task_of(body, "task.create")
        expect_state(task, "acquired", "created task")
        if task.get("version") != 1:
            raise BenchFailure(f"task.create of {id} gave version {task.get('version')}")

    await parallel(ctx.clients, ids, create)
    conns = await ctx.more_clients(len(workers))

    async def body(window: Window, rec: Recorder) -> None:
        async def worker(c: Client, pid: str) -> None:
            data = {"pid": pid, "tasks": [{"id": id, "version": 1} for id in owned[pid]]}
            while window.running:
                await timed(c, rec, "task.heartbeat", data)
                rec.add(pid, 0.0, c.read_at)

        await asyncio.gather(*(worker(c, pid) for c, pid in zip(conns, workers, strict=True)))

    rec, probe = await measured(ctx, "heartbeat", body)
    renewed = sum(rec.count(pid) * len(owned[pid]) for pid in workers)
    result = finish("heartbeat", "task.heartbeat", rec, probe, [("task.heartbeat", "req")])
    result.series.append(Series("leases renewed", "lease", int(renewed), opts.duration))

    async def check(c: Client, id: str) -> None:
        task = task_of((await c.ok("task.get", {"id": id}))[0], "task.get")
        if task.get("state") != "acquired" or task.get("version") != 1:
            raise BenchFailure(f"heartbeated task {id} lost its lease: {task}")
        if task.get("pid") != owner[id]:
            raise BenchFailure(f"task {id} is held by {task.get('pid')}, not {owner[id]}")

    # The workers go on heartbeating (unmeasured) while the tasks are checked and
    # fulfilled, as an SDK worker does until its task is done: on a slower store the
    # check and the fulfilment of every task may take longer than one lease.
    # Connections of their own: a connection carries one request at a time.
    n = len(ctx.clients)
    keepers = (await ctx.more_clients(n + len(workers)))[n:]
    done = asyncio.Event()

    async def keep(c: Client, pid: str) -> None:
        data = {"pid": pid, "tasks": [{"id": id, "version": 1} for id in owned[pid]]}
        while not done.is_set():
            await c.ok("task.heartbeat", data)
            try:
                await asyncio.wait_for(done.wait(), ttl / 4000)
            except TimeoutError:
                pass

    keeping = asyncio.gather(*(keep(c, pid) for c, pid in zip(keepers, workers, strict=True)))
    ledger = Ledger()

    async def fulfil(c: Client, id: str) -> None:
        ful = {"id": id, "version": 1, "action": settle_action(id)}
        ledger.fulfil((await c.ok("task.fulfill", ful))[0], id)

    try:
        await parallel(ctx.clients, ids, check)
        await parallel(ctx.clients, ids, fulfil)
    finally:
        done.set()
        await keeping
    result.checks.append(
        f"{len(ids):,} tasks still acquired at version 1 by their worker after "
        f"{opts.warmup + opts.duration:g} s with a {ttl} ms lease; each fulfilled once"
    )
    result.checks.append(await expect_census(ctx, "heartbeat", "resolved", len(ids)))
    per_heartbeat = counted(len(ids) // max(1, len(workers)), "lease")
    result.notes.append(f"each heartbeat renews {per_heartbeat}")
    return result


# -- handoff -------------------------------------------------------------------------------------


async def ops_call(ctx: Ctx, path: str, data: dict[str, Any] | None = None) -> Any:
    """The operator API of the first node: ``POST path`` with ``data`` (``GET`` without);
    anything but 200 fails the workload.  A connection of its own, as :meth:`Ctx.metrics`:
    the server closes idle ones."""
    conn = await HttpConnection.open(ctx.host, ctx.port)
    try:
        if data is None:
            status, body = await conn.get(path)
        else:
            status, body = await conn.post(msgspec.json.encode(data), path)
    finally:
        conn.close()
    if status != 200:
        raise BenchFailure(f"{path} {data!r} answered {status}: {body[:300]!r}")
    return msgspec.json.decode(body)


async def set_limit(ctx: Ctx, group: str, concurrency: int | None) -> None:
    """Set (None: delete) the concurrency limit of ``group``; with several server
    processes, wait until every one holds to it (each reads the limits every second)."""
    from troth.engine.limits import LIMITS_REFRESH

    if concurrency is None:
        await ops_call(ctx, "/ops/limits/delete", {"group": group})
    else:
        await ops_call(ctx, "/ops/limits/set", {"group": group, "concurrency": concurrency})
    if not isinstance(ctx.pid, int):  # several nodes, or a server of --url: unknown
        await asyncio.sleep(LIMITS_REFRESH + 0.5)


async def handoff(ctx: Ctx) -> list[Result]:
    """Flow control: one measurement per limit of ``--handoff-limits`` (a worker group
    under that limit, its backlog held), then lifecycle on a group without a limit
    while another group has one."""
    results = [await handoff_at(ctx, limit) for limit in ctx.opts.handoff_limits]
    results.append(await beside_limit(ctx))
    return results


@dataclass
class _AtOnce:
    """What the workers have at once: executes read and not yet fulfilled (the slots
    the server let through), tasks acquired and not yet fulfilled; the most of each."""

    executes: int = 0
    acquired: int = 0
    most_executes: int = 0
    most_acquired: int = 0

    def add(self, executes: int, acquired: int) -> None:
        self.executes += executes
        self.acquired += acquired
        self.most_executes = max(self.most_executes, self.executes)
        self.most_acquired = max(self.most_acquired, self.acquired)


async def handoff_at(ctx: Ctx, limit: int) -> Result:
    """A group of ``--workers`` SSE workers under ``concurrency limit``, with
    ``--handoff-backlog`` tasks held behind the limit throughout: each ``execute`` read
    is acquired, a task that replaces it in the backlog is created, and it is
    fulfilled.  The fulfil frees the slot, and the server writes the next held task's
    ``execute`` in the same commit.  ``handoff`` pairs the k-th fulfil written with the
    k-th ``execute`` read after the first ``limit`` (which the limit let through at
    once): an execute beyond those needs as many slots freed before it, so the time
    is never shorter than the real one.  Fails when the workers ever had more than
    ``limit`` executes or acquisitions at once."""
    opts = ctx.opts
    name = f"handoff-{limit}"
    tag = ctx.tag(name)
    pool = WorkerPool(ctx, f"{ctx.run}-ho{limit}", opts.workers)
    group = pool.group
    ledger = Ledger()
    conns = await ctx.more_clients(limit + 4)
    idle: asyncio.Queue[Client] = asyncio.Queue()
    for c in conns[:limit]:  # one per slot: a task in hand never waits for one
        idle.put_nowait(c)
    creators = conns[limit:]  # the first backlog, beside the workers' connections
    at_once = _AtOnce()
    arrived: list[float] = []  # executes read
    sent: list[float] = []  # fulfils written
    answered: list[float] = []  # fulfils answered
    created = [0]
    errors: list[BaseException] = []
    progress = asyncio.Event()
    handlers: set[asyncio.Task[None]] = set()

    async def body(window: Window, rec: Recorder) -> None:
        async def create(c: Client) -> None:
            n = created[0]
            created[0] += 1
            id = f"{ctx.run}-ho{limit}-{n}"
            pool.expect(id, 0).add_done_callback(functools.partial(on_execute, id))
            await create_targeted(c, rec, id, n, tag, pool.target)

        def on_execute(id: str, fut: asyncio.Future[tuple[float, str]]) -> None:
            if fut.cancelled():
                return
            read_at, pid = fut.result()
            arrived.append(read_at)
            at_once.add(1, 0)
            task = asyncio.create_task(run_task(id, pid, read_at))
            handlers.add(task)
            task.add_done_callback(handlers.discard)

        async def run_task(id: str, pid: str, read_at: float) -> None:
            try:
                c = await idle.get()
                try:
                    acq = {"id": id, "version": 0, "pid": pid, "ttl": 60_000}
                    version = ledger.acquired(await timed(c, rec, "task.acquire", acq), id)
                    at_once.add(0, 1)
                    if window.running:
                        await create(c)  # the backlog stays as long
                    at_once.add(-1, -1)  # before the fulfil is written: its slot frees
                    await fulfil_timed(c, rec, ledger, id, version)
                    sent.append(c.conn.sent_at)
                    answered.append(c.read_at)
                    rec.add("tasks", c.read_at - read_at, c.read_at)
                finally:
                    idle.put_nowait(c)
            except Exception as exc:
                errors.append(exc)
            finally:
                progress.set()

        await parallel(creators, range(limit + opts.handoff_backlog), lambda c, _: create(c))
        while True:
            if errors:
                raise errors[0]
            if not window.running and len(ledger.fulfilled) >= created[0]:
                return
            progress.clear()
            try:
                await asyncio.wait_for(progress.wait(), opts.op_timeout)
            except TimeoutError:
                raise BenchFailure(
                    f"{name}: no task fulfilled for {opts.op_timeout:.0f} s"
                    f" ({len(ledger.fulfilled)} of {created[0]} done)"
                ) from None

    await pool.open()
    await set_limit(ctx, group, limit)
    try:
        rec, probe = await measured(ctx, name, body)
        found = await ops_call(ctx, "/ops/limits")
    finally:
        for task in list(handlers):
            task.cancel()
        await pool.close()
        await set_limit(ctx, group, None)
    after = sorted(arrived)[limit:]  # the executes a freed slot let through
    for s, a in zip(sorted(sent), after, strict=False):
        rec.add("handoff", a - s, a)
    for s, a in zip(sorted(answered), after, strict=False):
        rec.add("after answer", a - s, a)
    result = finish(
        "handoff",
        "tasks",
        rec,
        probe,
        [("tasks", "task"), ("requests", "req")],
        [("handoff", "slot"), ("after answer", "slot")],
    )
    result.series = result.series[2:] + result.series[:2]
    result.context = f"limit {limit}"
    total = created[0]
    if len(ledger.fulfilled) != total:
        raise BenchFailure(f"{name}: {total} created, {len(ledger.fulfilled)} fulfilled")
    if at_once.most_executes > limit or at_once.most_acquired > limit:
        raise BenchFailure(
            f"{name}: the workers had {at_once.most_executes} executes and"
            f" {at_once.most_acquired} tasks acquired at once, beyond the limit of {limit}"
        )
    result.checks.append(
        f"at most {counted(at_once.most_executes, 'execute')} unfinished and"
        f" {counted(at_once.most_acquired, 'task')} acquired at once (limit {limit})"
    )
    usage = next((u for u in found.get("limits", []) if u.get("group") == group), None)
    if usage is None or usage.get("inUse") != 0 or usage.get("held") != 0:
        raise BenchFailure(f"{name}: after the last fulfil the server counts {usage!r}")
    result.checks.append(f"the server's count afterwards: limit {limit}, 0 in use, 0 held")
    result.checks.append(await expect_census(ctx, name, "resolved", total))
    result.checks.append(f"{total:,} tasks acquired once and fulfilled once")
    result.checks += pool.check()
    result.notes.append(
        "handoff = task.fulfill written → the next held task's execute read by a worker"
        f" (the k-th fulfil, the k-th execute after the first {limit}); after answer = from"
        " the fulfil's answer instead (negative: the execute came first)"
    )
    result.notes.append(
        "tasks = execute read → fulfil answered; each worker creates a task to take its"
        f" task's place among the {opts.handoff_backlog:,} held before it fulfils"
    )
    return result


async def beside_limit(ctx: Ctx) -> Result:
    """lifecycle on a group without a limit, while another group has one (every job
    then passes through flow control): what a limit costs the groups it does not
    limit, against lifecycle in the same run."""
    group = f"{ctx.run}-hx"
    await set_limit(ctx, group, 1)
    try:
        result = await lifecycle(ctx, "lifecycle-beside-limit", infix="lbl")
    finally:
        await set_limit(ctx, group, None)
    result.notes.append(
        "lifecycle on a group without a limit while another group has one (it gets no task)"
    )
    return result


def over_nats(ctx: Ctx) -> Ctx:
    """``ctx`` with its N clients sending over NATS (verification stays on HTTP)."""
    if ctx.nats_requests is None:
        raise BenchFailure("the NATS workloads need the run's NATS connection")
    requests = ctx.nats_requests
    timeout = ctx.opts.op_timeout
    clients: list[Client] = [
        NatsClient(requests, f"{ctx.run}-n{i}", timeout) for i in range(len(ctx.clients))
    ]
    return replace(ctx, clients=clients, extra=[])


#: Each workload by name; one gives a result, or several (handoff: one per limit).
RUNNERS: dict[str, Callable[[Ctx], Awaitable[Result | list[Result]]]] = {
    "create-settle": create_settle,
    "lifecycle": lifecycle,
    "create-settle-nats": lambda ctx: create_settle(over_nats(ctx), "create-settle-nats"),
    "lifecycle-nats": lambda ctx: lifecycle(over_nats(ctx), "lifecycle-nats", nats=True),
    "fanout": fanout,
    "reads": reads,
    "timers": timers,
    "heartbeat": heartbeat,
    "handoff": handoff,
}
