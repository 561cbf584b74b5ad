"""``--workloads sdk-workflows``: the Python SDK's workflows under load, on troth and
on the peer a PostgreSQL shop would pick instead of running a server, resonate-pg.

What a user of the SDK feels is not troth's request rate but how fast a workflow of
``ctx.run`` steps goes, alone and with many in flight.  This runs the same workload
(:mod:`troth_bench.sdk.workflows_py`, in the SDK's own venv) against each target,
one after the other in the same run:

* **troth on SQLite** (``synchronous=full``) and **troth on PostgreSQL** (a
  throwaway database), each a ``troth serve`` the bench starts;
* **resonate-pg** (``--peers resonate-pg``): its ``resonate.sql`` applied to a
  throwaway database on the same PostgreSQL server, the SDK talking to it through
  ``resonate_pg.PostgresConnection`` — "the server is the database".  The SQL file
  is not part of the ``resonate-pg`` package: ``--resonate-sql PATH`` names it (from
  the resonate-pg repository).

Per target: ``single`` — workflows one at a time in one SDK process (what a
workflow alone costs); then, for each count of ``--sdk-processes``, ``batch`` —
``--workflows`` workflows spread over that many SDK processes, each with
``--workflows-inflight`` in flight.  Each SDK process has a group of its own, so the
workflows it starts run in it and the step times it records are its own.  The CPU
of every process over each phase is read from ``/proc``: the server, the SDK
processes, and PostgreSQL's backends for the target's database (with the cluster's
WAL writer and checkpointer), so the table says who bounds the throughput.  With
``--rounds`` above 1 the targets are visited again in the reverse order, so no target
always runs first (or last) on a machine whose state drifts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from troth_bench.measure import proc_cpu
from troth_bench.pg import SHARED_BACKENDS, dbname_of, throwaway
from troth_bench.procs import ServerProcess, clean_env
from troth_bench.sdk_steps import PROGRAMS, PY_SDK, cache_dirs, scrape

PG_CONNECTOR = "resonate-pg==0.8.0"
PEER = "resonate-pg"
#: Where ``resonate.sql`` comes from (it is not in the PyPI package).
SQL_SOURCE = "resonate.sql from the resonate-pg repository (github.com/resonatehq/resonate-pg)"
INSTALL = (
    f"the SDK workflows need {PY_SDK} (and {PG_CONNECTOR} for --peers {PEER}) in a"
    " Python >= 3.12 venv under .sdk-cache/: `python3.12 -m venv"
    " .sdk-cache/py-workflows/venv && .sdk-cache/py-workflows/venv/bin/pip install"
    f" {PY_SDK} {PG_CONNECTOR}`"
)
#: Longest line an SDK process may answer with (bytes): a phase's every step gap.
LINE_LIMIT = 256 * 2**20
#: Longest one phase may take before the bench gives up on it (s).
PHASE_TIMEOUT = 900.0


@dataclass(frozen=True)
class Shape:
    """The knobs of the workload."""

    steps: int = 20  # sequential ctx.run steps per workflow
    workflows: int = 200  # workflows of one batch phase, over all SDK processes
    inflight: int = 16  # workflows in flight in each SDK process
    processes: tuple[int, ...] = (1,)  # SDK worker processes, one batch phase per count
    single: int = 10  # workflows of the single phase
    rounds: int = 1  # visits of every target (alternating order)


def find_python(need_pg: bool) -> Path | None:
    """A venv Python under the SDK caches with ``resonate`` (and ``resonate_pg`` when
    the peer runs: then every target uses that same venv, the same SDK)."""
    for cache in cache_dirs():
        for python in sorted(cache.glob("*/venv/bin/python")):
            site = list(python.parents[1].glob("lib/python3.*/site-packages"))
            if not site or not (site[0] / "resonate" / "resonate.py").exists():
                continue
            if need_pg and not (site[0] / "resonate_pg" / "connection.py").exists():
                continue
            return python
    return None


def sql_problem(path: str | None) -> str | None:
    """Why ``--resonate-sql`` cannot be used (None: it can)."""
    if not path:
        return f"--peers {PEER} needs --resonate-sql PATH: {SQL_SOURCE}"
    p = Path(path)
    if not p.is_file():
        return f"--resonate-sql {path}: no such file ({SQL_SOURCE})"
    if "resonate_rpc" not in p.read_text(errors="replace"):
        return f"--resonate-sql {path} does not define resonate.resonate_rpc: not {SQL_SOURCE}"
    return None


def apply_sql(url: str, path: Path) -> None:
    """Install resonate-pg on the (empty, throwaway) database ``url``."""
    script = path.read_text()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(script.encode())


@dataclass
class Phase:
    """One phase at one target: every workflow's wall time and step gaps (ms)."""

    target: str
    kind: str  # single | batch
    processes: int
    inflight: int
    workflows: int
    seconds: float
    walls: list[float]
    gaps: list[float]
    #: Cores (CPU seconds ÷ phase seconds) of: server, sdk, postgres.
    cores: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    round: int = 1
    #: troth's own ``troth_request_seconds`` over the phase: requests, and seconds.
    requests: int = 0
    request_seconds: float | None = None

    @property
    def rate(self) -> float:
        return self.workflows / self.seconds if self.seconds > 0 else 0.0

    def quantile(self, values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0.0

    @property
    def server_ms_per_step(self) -> float | None:
        """The server's CPU per step (None: no server, the peer)."""
        if "server" not in self.cores or not self.workflows:
            return None
        return self.cores["server"] * self.seconds * 1000 / (self.workflows * self.steps)

    @property
    def requests_per_step(self) -> float | None:
        if self.request_seconds is None or not self.workflows:
            return None
        return self.requests / (self.workflows * self.steps)

    @property
    def server_ms_per_request(self) -> float | None:
        """Mean time troth took to answer a request, as its metrics time it (from the
        request read to the response handed to the socket)."""
        if self.request_seconds is None or not self.requests:
            return None
        return self.request_seconds * 1000 / self.requests

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "kind": self.kind,
            "round": self.round,
            "processes": self.processes,
            "inflight": self.inflight,
            "workflows": self.workflows,
            "steps": self.steps,
            "seconds": self.seconds,
            "workflows_per_s": self.rate,
            "step_p50_ms": self.quantile(self.gaps, 0.5),
            "step_p99_ms": self.quantile(self.gaps, 0.99),
            "workflow_p50_ms": self.quantile(self.walls, 0.5),
            "cores": self.cores,
            "server_cpu_ms_per_step": self.server_ms_per_step,
            "requests_per_step": self.requests_per_step,
            "server_ms_per_request": self.server_ms_per_request,
        }


class SdkProcess:
    """One SDK worker process running workflows_py.py."""

    def __init__(self, python: Path, target: str, steps: int, group: str, log: Path) -> None:
        self.argv = [
            str(python),
            str(PROGRAMS / "workflows_py.py"),
            target,
            str(steps),
            group,
            f"wf-{group}-{uuid.uuid4().hex[:6]}",
        ]
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self) -> None:
        env = {k: v for k, v in clean_env().items() if not k.startswith("RESONATE_")}
        with open(self.log, "ab") as err:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                env=env,
                cwd=str(PROGRAMS),
                # A phase's answer is one line holding every step's gap: far over
                # asyncio's 64 KiB default line limit for a big phase.
                limit=LINE_LIMIT,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
            )

    async def line(self, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            raise RuntimeError(f"an SDK process gave no answer in {timeout:.0f} s") from None
        except ValueError as exc:  # a line over LINE_LIMIT
            raise RuntimeError(f"an SDK process's answer is too long: {exc}") from None
        if not raw:
            await self.proc.wait()
            raise RuntimeError(f"an SDK process exited with {self.proc.returncode}: {self.tail()}")
        return raw.decode(errors="replace").strip()

    async def ask(self, command: str) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        await self.proc.stdin.drain()
        data: dict[str, Any] = json.loads(await self.line(PHASE_TIMEOUT))
        return data

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.write(b"quit\n")
            await self.proc.stdin.drain()
        try:
            await asyncio.wait_for(self.proc.wait(), 20)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class DbBackends:
    """PostgreSQL's processes working for one database — its backends, and the WAL
    writer, checkpointer and background writer they share — looked up on one admin
    connection held open (not one connection per look-up).  None of them when the
    server is not local."""

    def __init__(self, base: str, url: str) -> None:
        self.base = base
        self.name = dbname_of(url)
        self.conn: psycopg.Connection[tuple[Any, ...]] | None = None
        host = str(conninfo_to_dict(base).get("host") or "")
        self.local = host in ("", "127.0.0.1", "localhost", "::1") or host.startswith("/")

    def __call__(self) -> list[int]:
        if not self.local:  # no /proc to read its processes in
            return []
        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect(self.base, autocommit=True)
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE (datname = %s OR backend_type = ANY(%s))"
            " AND pid <> pg_backend_pid()",
            (self.name, list(SHARED_BACKENDS)),
        ).fetchall()
        return [int(r[0]) for r in rows]

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class CpuMeter:
    """CPU seconds of groups of processes over a phase.  The database's backends are
    looked up again every 0.2 s while the phase runs (a connection pool opens
    backends as load grows); each counts from the first time it was seen."""

    def __init__(self, fixed: dict[str, list[int]], db: DbBackends | None) -> None:
        self.fixed = fixed
        self.db = db
        self.first: dict[tuple[str, int], float] = {}
        self.last: dict[tuple[str, int], float] = {}
        self._task: asyncio.Task[None] | None = None

    def _read(self, group: str, pids: list[int]) -> None:
        for pid in pids:
            cpu = proc_cpu(pid)
            if cpu is not None:
                self.first.setdefault((group, pid), cpu)
                self.last[(group, pid)] = cpu

    async def _scan(self) -> None:
        for group, pids in self.fixed.items():
            self._read(group, pids)
        if self.db is not None:
            self._read("postgres", await asyncio.to_thread(self.db))

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            await self._scan()

    async def start(self) -> None:
        await self._scan()
        self._task = asyncio.create_task(self._follow())

    async def stop(self, seconds: float) -> dict[str, float]:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._scan()
        out: dict[str, float] = {}
        for (group, pid), last in self.last.items():
            out[group] = out.get(group, 0.0) + last - self.first[(group, pid)]
        for group in [*self.fixed, *(["postgres"] if self.db else [])]:
            out.setdefault(group, 0.0)
        return {g: v / seconds if seconds > 0 else 0.0 for g, v in out.items()}


@dataclass
class Target:
    """Where the SDK sends its requests, and the processes that serve it."""

    name: str
    address: str  # an http:// URL, or pg:<conninfo>
    server_pids: list[int]
    db: DbBackends | None
    port: int | None = None  # troth's, for its /metrics


async def run_target(
    target: Target, python: Path, shape: Shape, workdir: Path, say: Callable[..., None], rnd: int
) -> list[Phase]:
    """The single phase, then a batch phase per SDK-process count, on one target."""
    most = max(shape.processes)
    procs = [
        SdkProcess(
            python,
            target.address,
            shape.steps,
            f"wf{k}",
            workdir / f"sdk-{target.name.replace(' ', '-')}-{rnd}-{k}.log",
        )
        for k in range(most)
    ]
    phases: list[Phase] = []
    try:
        for p in procs:
            await p.start()
        for p in procs:
            warmed = await p.line(120.0)
            if warmed != "warmed":
                raise RuntimeError(f"an SDK process said {warmed!r}: {p.tail()}")
        runs: list[tuple[str, int, int, int]] = [("single", 1, shape.single, 1)]
        runs += [("batch", n, shape.workflows, shape.inflight) for n in shape.processes]
        for kind, n, count, inflight in runs:
            used = procs[:n]
            fixed = {"sdk": [p.pid for p in used]}
            if target.server_pids:
                fixed["server"] = target.server_pids
            meter = CpuMeter(fixed, target.db)
            before = await scrape(target.port) if target.port else {}
            await meter.start()
            shares = [count // n + (1 if k < count % n else 0) for k in range(n)]
            t0 = time.perf_counter()
            answers = await asyncio.gather(
                *(
                    p.ask(f"single {s}" if kind == "single" else f"batch {s} {inflight}")
                    for p, s in zip(used, shares, strict=True)
                    if s > 0
                )
            )
            seconds = max(a["ended"] for a in answers) - min(a["began"] for a in answers)
            cores = await meter.stop(max(seconds, time.perf_counter() - t0))
            after = await scrape(target.port) if target.port else {}
            walls = [w for a in answers for w in a["walls"]]
            if len(walls) != count:
                raise RuntimeError(f"{target.name}: {count} workflows asked, {len(walls)} done")
            phase = Phase(
                target.name,
                kind,
                n,
                inflight,
                count,
                seconds,
                walls,
                [g for a in answers for g in a["gaps"]],
                cores,
                shape.steps,
                rnd,
            )
            if target.port:
                phase.requests = sum(c - before.get(k, (0.0, 0))[1] for k, (_, c) in after.items())
                phase.request_seconds = sum(
                    s - before.get(k, (0.0, 0))[0] for k, (s, _) in after.items()
                )
            phases.append(phase)
            say(phase_line(phase))
    finally:
        await asyncio.gather(*(p.stop() for p in procs))
    return phases


@contextlib.contextmanager
def troth_target(store: str, pg_base: str, workdir: Path) -> Iterator[Callable[[], Any]]:
    """A ``troth serve`` on ``store`` (SQLite ``synchronous=full``, or a throwaway
    PostgreSQL database), yielded as a coroutine function that starts it."""
    holder: contextlib.AbstractContextManager[str | None] = (
        throwaway(pg_base, "troth_bench_wf") if store == "postgres" else contextlib.nullcontext()
    )
    with holder as url:
        server = ServerProcess.troth(
            workdir, workdir / "troth.db", synchronous="full", store=store, postgres_url=url
        )

        async def start() -> Target:
            await server.start()
            db = DbBackends(pg_base, url) if url else None
            target = Target(f"troth {store}", server.url, [server.pid], db, server.port)
            made.append(target)
            return target

        made: list[Target] = []
        try:
            yield start
        finally:
            server.stop()
            for t in made:
                if t.db is not None:
                    t.db.close()


async def sdk_workflows(
    shape: Shape,
    stores: tuple[str, ...],
    resonate_sql: str | None,
    workdir: Path,
    pg_base: str,
    say: Callable[..., None],
) -> list[Phase]:
    """Every target, ``shape.rounds`` times, alternating their order."""
    names = [f"troth {s}" for s in stores] + ([PEER] if resonate_sql else [])
    python = find_python(resonate_sql is not None)
    if python is None:
        raise RuntimeError(INSTALL)
    say(*header(shape))
    phases: list[Phase] = []
    for rnd in range(1, shape.rounds + 1):
        order = names if rnd % 2 else names[::-1]
        for name in order:
            where = workdir / f"wf-{name.replace(' ', '-')}-{rnd}"
            where.mkdir(parents=True, exist_ok=True)
            if name == PEER:
                assert resonate_sql is not None
                with throwaway(pg_base, "troth_bench_rpg") as url:
                    await asyncio.to_thread(apply_sql, url, Path(resonate_sql))
                    target = Target(PEER, f"pg:{url}", [], DbBackends(pg_base, url))
                    try:
                        phases += await run_target(target, python, shape, where, say, rnd)
                    finally:
                        assert target.db is not None
                        target.db.close()
            else:
                with troth_target(name.split()[1], pg_base, where) as start:
                    target = await start()
                    phases += await run_target(target, python, shape, where, say, rnd)
    return phases


def header(shape: Shape) -> list[str]:
    return [
        f"-- sdk-workflows: {shape.steps} sequential ctx.run steps per workflow; single ="
        f" {shape.single} workflows one at a time; batch = {shape.workflows} workflows,"
        f" {shape.inflight} in flight per SDK process",
        "  target          phase      procs   wf/s  step p50  step p99  wf p50 ms"
        "   cores: server   sdk  postgres  server CPU ms/step  req/step  troth ms/req",
    ]


def phase_line(p: Phase) -> str:
    def core(key: str) -> str:
        return f"{p.cores[key]:6.2f}" if key in p.cores else "     -"

    per_step = p.server_ms_per_step
    return (
        f"  {p.target:<15} {p.kind:<9} {p.processes:6}  {p.rate:5.1f}"
        f"  {p.quantile(p.gaps, 0.5):8.2f}  {p.quantile(p.gaps, 0.99):8.2f}"
        f"  {p.quantile(p.walls, 0.5):9.1f}   {core('server'):>13} {core('sdk')}"
        f"  {core('postgres'):>8}  {'-' if per_step is None else f'{per_step:.3f}':>18}"
        f"  {_opt(p.requests_per_step, 8)}  {_opt(p.server_ms_per_request, 12, 3)}"
    )


def _opt(value: float | None, width: int, digits: int = 2) -> str:
    return f"{'-' if value is None else f'{value:.{digits}f}':>{width}}"


def summary_lines(phases: list[Phase]) -> list[str]:
    """Medians over rounds, and troth against the peer."""
    out: list[str] = []
    by: dict[tuple[str, str, int], list[Phase]] = {}
    for p in phases:
        by.setdefault((p.target, p.kind, p.processes), []).append(p)
    peer_single = by.get((PEER, "single", 1))
    if peer_single is None:
        return out
    peer_p50 = statistics.median(p.quantile(p.gaps, 0.5) for p in peer_single)
    for (target, kind, n), group in by.items():
        if target == PEER:
            continue
        peer = by.get((PEER, kind, n))
        if kind == "single":
            mine = statistics.median(p.quantile(p.gaps, 0.5) for p in group)
            line = (
                f"  {target}: a workflow alone, step p50 {mine:.2f} ms vs resonate-pg"
                f" {peer_p50:.2f} ms ({mine / peer_p50:.2f}×)"
            )
            per_req = [p.server_ms_per_request for p in group if p.server_ms_per_request]
            per_step = [p.requests_per_step for p in group if p.requests_per_step]
            if per_req and per_step:
                reqs, each = statistics.median(per_step), statistics.median(per_req)
                line += (
                    f"; troth's own time {reqs * each:.2f} ms of it"
                    f" ({reqs:.1f} requests × {each:.2f} ms)"
                )
            out.append(line)
        elif peer is not None:
            mine = statistics.median(p.rate for p in group)
            theirs = statistics.median(p.rate for p in peer)
            out.append(
                f"  {target}: {n} SDK process(es), {mine:.1f} workflows/s vs resonate-pg"
                f" {theirs:.1f} ({mine / theirs:.2f}×)"
            )
    return out
