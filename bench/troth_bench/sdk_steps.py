"""``troth bench --workloads sdk-steps``: the latency of one ``ctx.run`` step of a
workflow run by the published SDKs, against troth and in the SDKs' own process.

Why this is a workload of its own: the other workloads drive troth with the bench's
lean client, so they say what troth costs; a user's workflow pays for the SDK's HTTP
stack, its own per-step work and the server's answer as well (a
TypeScript workflow of ~930 sequential fences took 3-11 s against troth and ~1 s in
the SDK's in-process mode).  Here each SDK runs a workflow of N sequential steps
(``bench/troth_bench/sdk/steps_py.py``, ``steps_ts.mjs``) in its own process, as a user
runs it, once in its in-process mode (no server) and once against a fresh troth per
store (SQLite with ``synchronous=FULL``, memory, PostgreSQL on a throwaway database),
all in one run.  A step's latency is the gap between two consecutive step functions'
first starts, read in the SDK's process; troth's share is what its ``/metrics`` say
it spent answering (``troth_request_seconds``, from the request's body read to its
answer sent) during the measured workflow, divided by the steps.

The SDKs are not troth's dependencies.  They are found where the SDK tests build them
(``.sdk-cache/``, or ``TROTH_SDK_CACHE``); an SDK that is not there is skipped with a
line that says how to install it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from troth_bench.http import HttpConnection
from troth_bench.pg import throwaway
from troth_bench.procs import ServerProcess, clean_env

#: The workflow programs (shipped with the package).
PROGRAMS = Path(__file__).resolve().parent / "sdk"
#: What the SDK tests install (tests/helpers/sdk_env.py); the bench uses the same.
PY_SDK = "resonate-sdk==0.8.1"
TS_SDK = "@resonatehq/sdk@0.11.5"
SDKS = ("python", "typescript")
STORES = ("sqlite", "memory", "postgres")
#: Longest one workflow run may take before the bench gives up on it (s).
RUN_TIMEOUT = 600.0

INSTALL = {
    "python": (
        f"the Python SDK needs {PY_SDK} in a Python >= 3.12 venv under .sdk-cache/: run the"
        " SDK tests once (.venv/bin/pytest tests/sdk/test_sdk_hitl.py -k python), or"
        f" `python3.12 -m venv .sdk-cache/py-steps/venv && .sdk-cache/py-steps/venv/bin/pip"
        f" install {PY_SDK}`"
    ),
    "typescript": (
        f"the TypeScript SDK needs Node >= 20.6 and {TS_SDK} under .sdk-cache/: run the"
        " SDK tests once (.venv/bin/pytest tests/sdk/test_sdk_hitl.py -k typescript), or"
        f" `mkdir -p .sdk-cache/ts-steps && npm install --prefix .sdk-cache/ts-steps {TS_SDK}`"
    ),
}


def cache_dirs() -> list[Path]:
    """Where SDK environments may be: ``TROTH_SDK_CACHE``, ``./.sdk-cache``, and the
    checkout's ``.sdk-cache`` when the lab is installed from one (editable:
    ``bench/troth_bench/`` is two folders below it)."""
    found = []
    if env := os.environ.get("TROTH_SDK_CACHE"):
        found.append(Path(env))
    found.append(Path.cwd() / ".sdk-cache")
    found.append(Path(__file__).resolve().parents[2] / ".sdk-cache")
    out: list[Path] = []
    for d in found:
        if d.is_dir() and d.resolve() not in [o.resolve() for o in out]:
            out.append(d)
    return out


def find_python_sdk(caches: list[Path]) -> Path | None:
    """A Python interpreter that has ``resonate`` (a venv under a cache dir)."""
    for cache in caches:
        for python in sorted(cache.glob("*/venv/bin/python")):
            if list(python.parents[1].glob("lib/python3.*/site-packages/resonate/resonate.py")):
                return python
    return None


def find_node_sdk(caches: list[Path]) -> Path | None:
    """An npm prefix with ``@resonatehq/sdk`` installed, when Node is on PATH."""
    if shutil.which("node") is None:
        return None
    for cache in caches:
        for package in sorted(cache.glob("*/node_modules/@resonatehq/sdk/package.json")):
            return package.parents[3]
    return None


@dataclass
class StepRun:
    """One SDK's measured workflow at one place (``local`` or a store)."""

    sdk: str
    where: str
    steps: int
    gaps_ms: list[float]
    wall_ms: float
    #: From troth's /metrics over the measured workflow (absent in-process).
    server_ms: float | None = None
    requests: dict[str, int] = field(default_factory=dict)

    def quantile(self, q: float, part: slice = slice(None)) -> float:
        values = sorted(self.gaps_ms[part])
        return values[min(len(values) - 1, int(len(values) * q))] if values else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "sdk": self.sdk,
            "where": self.where,
            "steps": self.steps,
            "step_p50_ms": self.quantile(0.5),
            "step_p99_ms": self.quantile(0.99),
            "wall_ms": self.wall_ms,
            "server_ms": self.server_ms,
            "requests": self.requests,
        }


def parse_output(sdk: str, where: str, text: str) -> StepRun:
    """The program's last line: ``{"steps", "began", "ended", "starts"}`` (ms)."""
    lines = [line for line in text.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{sdk} at {where} printed no result: {text[-2000:]}")
    data = json.loads(lines[-1])
    starts: list[float] = data["starts"]
    if len(starts) != data["steps"] or any(b < a for a, b in itertools.pairwise(starts)):
        raise RuntimeError(f"{sdk} at {where}: steps missing or out of order")
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    return StepRun(sdk, where, data["steps"], gaps, data["ended"] - data["began"])


SAMPLE = re.compile(r'^troth_request_seconds_(sum|count)\{kind="([^"]+)"\} (\S+)$')


def request_seconds(metrics: str) -> dict[str, tuple[float, int]]:
    """``kind → (seconds, count)`` of ``troth_request_seconds`` in a /metrics text."""
    out: dict[str, tuple[float, int]] = {}
    for line in metrics.splitlines():
        if m := SAMPLE.match(line):
            seconds, count = out.get(m[2], (0.0, 0))
            if m[1] == "sum":
                seconds = float(m[3])
            else:
                count = int(float(m[3]))
            out[m[2]] = (seconds, count)
    return out


async def scrape(port: int) -> dict[str, tuple[float, int]]:
    conn = await HttpConnection.open("127.0.0.1", port)
    try:
        status, body = await asyncio.wait_for(conn.get("/metrics"), 10)
    finally:
        conn.close()
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    return request_seconds(body.decode())


class Program:
    """One workflow program as a child process: it runs its warm-up, prints
    ``warmed``, waits for a line on stdin, runs the measured workflow and prints its
    result; the bench reads troth's metrics in between."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.argv = argv
        self.cwd = cwd
        self.proc: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []

    async def start(self) -> None:
        env = {k: v for k, v in clean_env().items() if not k.startswith("RESONATE_")}
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            cwd=self.cwd,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )

    async def until(self, want: Callable[[str], bool]) -> str:
        """Read lines until one satisfies ``want``; fail with the output if it ends."""
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), RUN_TIMEOUT)
            if not raw:
                await self.proc.wait()
                tail = "\n".join(self.lines[-40:])
                raise RuntimeError(
                    f"{' '.join(self.argv)} exited with {self.proc.returncode}:\n{tail}"
                )
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines.append(line)
            if want(line):
                return line

    async def go(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        await self.proc.stdin.drain()

    async def finish(self) -> None:
        assert self.proc is not None
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        finally:
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()


class Programs:
    """The argv of each available SDK's workflow program."""

    def __init__(self, python: Path | None, node_root: Path | None) -> None:
        self.python = python
        self.node_root = node_root

    @classmethod
    def find(cls) -> Programs:
        caches = cache_dirs()
        return cls(find_python_sdk(caches), find_node_sdk(caches))

    def available(self, sdk: str) -> bool:
        return (self.python if sdk == "python" else self.node_root) is not None

    def argv(self, sdk: str, target: str, steps: int, wf: str) -> tuple[list[str], Path]:
        if sdk == "python":
            assert self.python is not None
            program = PROGRAMS / "steps_py.py"
            return [str(self.python), str(program), target, str(steps), wf], PROGRAMS
        assert self.node_root is not None
        # ESM resolves bare imports from the script's directory upwards: the program
        # goes next to the SDK's node_modules (as the SDK tests do).
        here = self.node_root / "programs"
        here.mkdir(exist_ok=True)
        script = here / "steps_ts.mjs"
        source = (PROGRAMS / "steps_ts.mjs").read_bytes()
        if not script.exists() or script.read_bytes() != source:
            script.write_bytes(source)
        node = shutil.which("node") or "node"
        return [node, str(script), target, str(steps), wf], here


async def measure(
    programs: Programs,
    sdk: str,
    where: str,
    steps: int,
    port: int | None,
) -> StepRun:
    """One workflow of ``steps`` steps (after the program's own warm-up), with troth's
    request seconds over exactly that workflow when it goes to a server."""
    wf = f"steps-{sdk[:2]}-{uuid.uuid4().hex[:8]}"
    target = "local" if port is None else f"http://127.0.0.1:{port}"
    program = Program(*programs.argv(sdk, target, steps, wf))
    await program.start()
    try:
        await program.until(lambda line: line == "warmed")
        before = await scrape(port) if port is not None else {}
        await program.go()
        text = await program.until(lambda line: line.startswith("{"))
        after = await scrape(port) if port is not None else {}
    finally:
        await program.finish()
    run = parse_output(sdk, where, text)
    if port is not None:
        seconds = 0.0
        for kind, (s_after, c_after) in after.items():
            s_before, c_before = before.get(kind, (0.0, 0))
            seconds += s_after - s_before
            if c_after > c_before:
                run.requests[kind] = c_after - c_before
        run.server_ms = seconds * 1000
    return run


async def sdk_steps(
    steps: int,
    sdks: tuple[str, ...],
    stores: tuple[str, ...],
    workdir: Path,
    pg_base: str,
    say: Callable[..., None],
    programs: Programs | None = None,
) -> list[StepRun]:
    """Every available SDK in-process, then against a fresh troth on each store."""
    programs = programs or Programs.find()
    runs: list[StepRun] = []
    ready = []
    for sdk in sdks:
        if programs.available(sdk):
            ready.append(sdk)
        else:
            say(f"  sdk-steps: skipping the {sdk} SDK: {INSTALL[sdk]}")
    if not ready:
        return runs
    for sdk in ready:
        runs.append(await measure(programs, sdk, "in-process", steps, None))
        say(*step_lines([runs[-1]], header=len(runs) == 1))
    for store in stores:
        holder: contextlib.AbstractContextManager[str | None] = (
            throwaway(pg_base, "troth_bench_steps")
            if store == "postgres"
            else contextlib.nullcontext()
        )
        with holder as url:
            server = ServerProcess.troth(
                workdir / f"steps-{store}",
                workdir / f"steps-{store}" / "troth.db",
                synchronous="full",
                store=store,
                postgres_url=url,
            )
            await server.start()
            try:
                for sdk in ready:
                    where = "troth sqlite FULL" if store == "sqlite" else f"troth {store}"
                    runs.append(await measure(programs, sdk, where, steps, server.port))
                    say(*step_lines([runs[-1]], header=False))
            finally:
                server.stop()
    return runs


def step_lines(runs: list[StepRun], header: bool = True) -> list[str]:
    """The table: per-step latency, and troth's share of it."""
    out = []
    if header:
        out.append(
            "  sdk         where              steps  step p50 ms  p99 ms  first/last 10% p50"
            "  wall s  req/step  troth ms/step  troth share"
        )
    for r in runs:
        tenth = max(1, len(r.gaps_ms) // 10)
        first = r.quantile(0.5, slice(0, tenth))
        last = r.quantile(0.5, slice(len(r.gaps_ms) - tenth, None))
        if r.server_ms is None:
            server = "      -              -            -"
        else:
            per_step = r.server_ms / r.steps
            mean = r.wall_ms / r.steps
            share = per_step / mean if mean > 0 else 0.0
            server = f"  {sum(r.requests.values()) / r.steps:8.2f}  {per_step:13.2f}  {share:10.0%}"
        out.append(
            f"  {r.sdk:<10}  {r.where:<17} {r.steps:6,}  {r.quantile(0.5):11.2f}"
            f"  {r.quantile(0.99):6.2f}  {first:8.2f} / {last:<8.2f}"
            f"  {r.wall_ms / 1000:6.2f}{server}"
        )
    return out
