"""``troth bench``: measure the limits, start (or target) a server, run the workloads,
print the tables; optionally compare databases of different sizes (``--scale``).

The generator is this one process on uvloop: the lean client in
:mod:`troth.bench.http` costs ~15 µs of CPU per request (the bare-HTTP line prints
the measured figure), so on a 2-core machine it needs a fraction of the core the
server's event loop leaves it.  Every section reports its CPU next to the server's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

from troth.bench.client import BenchFailure, Client
from troth.bench.http import split_url
from troth.bench.limits import http_limit, sqlite_limits
from troth.bench.measure import rss_bytes, wait_quiet
from troth.bench.options import Options, add_bench_flags, options_from
from troth.bench.procs import ServerProcess
from troth.bench.profile import Profiler, render
from troth.bench.report import (
    limits_lines,
    mb,
    result_lines,
    scale_lines,
    summary_lines,
    target_lines,
)
from troth.bench.results import Limits, Result, ScalePoint
from troth.bench.seed import SeedIds, seed
from troth.bench.workloads import RUNNERS, Ctx, reads_of


@dataclass
class Report:
    """Everything one run measured (what ``--json`` writes)."""

    settings: dict[str, Any]
    limits: Limits = field(default_factory=Limits)
    results: list[Result] = field(default_factory=list)
    scale: list[ScalePoint] = field(default_factory=list)
    rss_at_rest: int | None = None
    rss_after: int | None = None
    ok: bool = True
    failure: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "limits": self.limits.to_json(),
            "results": [r.to_json() for r in self.results],
            "scale": [p.to_json() for p in self.scale],
            "rss_at_rest": self.rss_at_rest,
            "rss_after": self.rss_after,
            "ok": self.ok,
            "failure": self.failure,
        }


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def _mount_of(path: Path) -> str:
    """File system type and device of ``path`` (the SQLite ceiling depends on it)."""
    best = ("", "?", "?")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                if str(path.resolve()).startswith(mnt) and len(mnt) >= len(best[0]):
                    best = (mnt, fstype, dev)
    except OSError:
        pass
    return f"{best[1]} ({best[2]}) mounted at {best[0] or '?'}"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def describe(opts: Options, workdir: Path) -> dict[str, Any]:
    """The settings in force, from the code itself where they live."""
    from troth.outbox.types import DispatchConfig
    from troth.server.config import Settings
    from troth.server.engine import MAX_BATCH

    server = Settings()
    dispatch = DispatchConfig()
    sqlite_off = bool(opts.url) or opts.store != "sqlite"  # unknown, or no SQLite
    return {
        "troth": _version("troth"),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "uvicorn": _version("uvicorn"),
        "uvloop": _version("uvloop"),
        "httptools": _version("httptools"),
        "msgspec": _version("msgspec"),
        "sqlite": sqlite3.sqlite_version,
        "cpus": os.cpu_count() or 0,
        "cpu_model": _cpu_model(),
        "kernel": platform.release(),
        "target": opts.url or "started by the bench",
        "store": opts.store if not opts.url else "(external server)",
        "synchronous": "-" if sqlite_off else opts.synchronous,
        "journal": "-" if sqlite_off else "WAL",
        "group_commit_max_jobs": MAX_BATCH,
        "dispatch_batch": dispatch.batch_size,
        "dispatch_concurrency": server.dispatch_concurrency,
        "retry_timeout_ms": server.retry_timeout,
        "access_log": "off (--log-level warning)",
        "workdir": str(workdir),
        "filesystem": _mount_of(workdir),
        "clients": opts.clients,
        "sse_workers": opts.workers,
        "warmup_s": opts.warmup,
        "window_s": opts.duration,
        "generator": "1 process, uvloop, raw HTTP/1.1 keep-alive (httptools)",
    }


def settings_lines(s: dict[str, Any]) -> list[str]:
    return [
        "troth bench",
        f"  software: troth {s['troth']} · {s['python']} · uvicorn {s['uvicorn']} "
        f"(uvloop {s['uvloop']}, httptools {s['httptools']}) · msgspec {s['msgspec']} "
        f"· SQLite {s['sqlite']}",
        f"  machine:  {s['cpus']} CPUs ({s['cpu_model']}), Linux {s['kernel']}",
        f"  storage:  {s['filesystem']}; work dir {s['workdir']}",
        f"  server:   {s['target']}; store={s['store']} synchronous={s['synchronous']} "
        f"journal={s['journal']}; group commit <= {s['group_commit_max_jobs']} requests per "
        f"transaction; dispatch batch {s['dispatch_batch']}, concurrency "
        f"{s['dispatch_concurrency']}; retry_timeout {s['retry_timeout_ms']} ms; "
        f"access log {s['access_log']}",
        f"  load:     {s['clients']} clients, {s['sse_workers']} SSE workers; "
        f"warm-up {s['warmup_s']:g} s, window {s['window_s']:g} s per workload; "
        f"generator {s['generator']}",
    ]


class Bench:
    """One run: owns the working directory, the servers it starts and the output."""

    def __init__(self, opts: Options, out: TextIO) -> None:
        self.opts = opts
        self.out = out
        self.owned_dir = opts.dir is None
        self.workdir = Path(opts.dir or tempfile.mkdtemp(prefix="troth-bench-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.run_id = "b" + secrets.token_hex(3)
        self.report = Report(describe(opts, self.workdir))

    def say(self, *lines: str) -> None:
        for line in lines:
            print(line, file=self.out, flush=True)

    async def quiet(self, what: str) -> None:
        """On a shared machine, let other load pass before measuring (--wait-quiet)."""
        if self.opts.wait_quiet <= 0:
            return
        waited = await wait_quiet(self.opts.wait_quiet)
        if waited is None:
            self.say(f"  (machine still busy after {self.opts.wait_quiet:g} s; measuring {what})")
        elif waited > 1.5:
            self.say(f"  (waited {waited:.0f} s for the machine to be quiet before {what})")

    async def main(self) -> Report:
        opts = self.opts
        self.say(*settings_lines(self.report.settings), "")
        limits = self.report.limits
        await self.quiet("the limits")
        await asyncio.to_thread(
            sqlite_limits, self.workdir, opts.synchronous, opts.limit_seconds, limits
        )
        await self.quiet("the bare HTTP round trip")
        await http_limit(self.workdir, opts.clients, opts.limit_seconds, limits)
        self.say(*limits_lines(limits, opts.synchronous), "")
        try:
            if opts.workloads:
                await self.main_run()
            for count in opts.scale:
                self.report.scale.append(await self.scale_point(count))
        except BenchFailure as exc:
            self.report.ok = False
            self.report.failure = str(exc)
            self.say("", f"BENCH FAILED: {exc}")
        if self.report.results:
            self.say(*summary_lines(self.report.results, limits), "")
            self.say(
                f"server RSS at rest {mb(self.report.rss_at_rest)},"
                f" after the workloads {mb(self.report.rss_after)}",
                "",
            )
        if self.report.scale:
            self.say(*scale_lines(self.report.scale), "")
        self.say(
            *target_lines(
                self.report.results,
                self.report.scale,
                self.report.settings["cpus"],
                opts.synchronous,
                opts.clients,
            )
        )
        if opts.json:
            Path(opts.json).write_text(json.dumps(self.report.to_json(), indent=2))
        return self.report

    async def main_run(self) -> None:
        opts = self.opts
        server: ServerProcess | None = None
        if opts.url:
            host, port = split_url(opts.url)
        else:
            server = ServerProcess.troth(
                self.workdir,
                self.workdir / "troth.db",
                synchronous=opts.synchronous,
                store=opts.store,
            )
            await server.start()
            host, port = "127.0.0.1", server.port
        try:
            pid = server.pid if server else None
            self.report.rss_at_rest = rss_bytes(pid) if pid else None
            results = await self.workloads(host, port, pid, opts, self.run_id, server)
            self.report.results.extend(results)
            self.report.rss_after = rss_bytes(pid) if pid else None
        finally:
            if server is not None:
                code = server.stop()
                if code != 0 and self.report.ok:
                    raise BenchFailure(f"server exited with {code}: {server.tail()}")

    async def workloads(
        self,
        host: str,
        port: int,
        pid: int | None,
        opts: Options,
        run: str,
        server: ServerProcess | None,
        names: tuple[str, ...] | None = None,
        read_ids: Sequence[str] | None = None,
        sink: list[Result] | None = None,
        context: str = "",
    ) -> list[Result]:
        """Run workloads on one server with one set of N connections."""
        clients = [await Client.open(host, port, f"{run}-c{i}") for i in range(opts.clients)]
        spare = await Client.open(host, port, f"{run}-spare")
        ctx = Ctx(host, port, opts, run, clients, spare, pid, metrics_url=(host, port))
        profiler = None
        if opts.profile and pid is not None:
            profiler = Profiler(Path(opts.profile) / run, pid, opts.profile_mode)
            ctx.on_window = profiler.during
        results: list[Result] = [] if sink is None else sink
        try:
            for name in names or opts.workloads:
                await self.quiet(name)
                if name == "reads" and read_ids is not None:
                    result = await reads_of(ctx, read_ids, "resolved")
                else:
                    result = await RUNNERS[name](ctx)
                result.context = context
                results.append(result)
                if server is not None and not server.alive():
                    raise BenchFailure(f"server died during {name}: {server.tail()}")
                self.say(*result_lines(result, self.report.limits))
                if profiler is not None:
                    if name in profiler.profiles:
                        self.say(*render(name, profiler.profiles[name]))
                    elif name in profiler.errors:
                        self.say(f"  profile: {profiler.errors[name]}")
                self.say("")
        finally:
            for c in [*clients, *ctx.extra, spare]:
                c.close()
        return results

    async def scale_point(self, count: int) -> ScalePoint:
        """A fresh server on a database seeded with ``count`` settled promises."""
        opts = self.opts
        directory = self.workdir / f"scale-{count}"
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        db = directory / "troth.db"
        self.say(f"scale: seeding {count:,} settled promises into {db} ...")
        seconds = await asyncio.to_thread(seed, db, count, "s-")
        size = sum(
            Path(f"{db}{s}").stat().st_size for s in ("", "-wal") if Path(f"{db}{s}").exists()
        )
        self.say(f"scale: seeded in {seconds:.1f} s, {size / 2**20:,.0f} MB")
        server = ServerProcess.troth(directory, db, synchronous=opts.synchronous, store="sqlite")
        await server.start(timeout=120)
        point = ScalePoint(count, seconds, size, rss_bytes(server.pid))
        sub = replace(opts, duration=opts.scale_seconds, warmup=min(opts.warmup, 1.0))
        ids = SeedIds("s-", count)
        try:
            await self.workloads(
                "127.0.0.1",
                server.port,
                server.pid,
                sub,
                f"{self.run_id}s{count}",
                server,
                names=("reads", "create-settle", "lifecycle"),
                read_ids=ids,
                sink=point.results,
                context=f"{count:,} stored",
            )
            point.rss_after = rss_bytes(server.pid)
        finally:
            code = server.stop()
            if not opts.keep:
                shutil.rmtree(directory, ignore_errors=True)
        if code != 0:
            raise BenchFailure(f"scale server exited with {code}: {server.tail()}")
        return point

    def cleanup(self) -> None:
        if self.owned_dir and not self.opts.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)


def run(opts: Options, out: TextIO = sys.stdout) -> Report:
    """Run the bench; the report says whether every verification passed."""
    import uvloop

    bench = Bench(opts, out)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(bench.main())
    finally:
        bench.cleanup()


def run_from_args(args: argparse.Namespace) -> int:
    """Entry point for ``troth bench``: exit status 1 when a verification failed."""
    opts = options_from(args)
    started = time.perf_counter()
    report = run(opts)
    print(f"\nbench took {time.perf_counter() - started:.0f} s", flush=True)
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="troth bench", description=__doc__)
    add_bench_flags(parser)
    return run_from_args(parser.parse_args(argv))
