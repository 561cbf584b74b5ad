"""``troth bench``: measure the limits, start (or target) a server, run the workloads,
print the tables; optionally compare databases of different sizes (``--scale``).

The generator is this one process on uvloop: the lean client in
:mod:`troth_bench.http` costs ~15 µs of CPU per request (the bare-HTTP line prints
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

import psycopg
from psycopg.conninfo import conninfo_to_dict

from troth.plural import counted
from troth_bench import horizon
from troth_bench.ceiling import machine_ceiling
from troth_bench.client import BenchFailure, Client
from troth_bench.http import split_url
from troth_bench.limits import http_limit, sqlite_limits
from troth_bench.measure import DbPids, rss_bytes, wait_quiet
from troth_bench.nats import HOW_TO_GET, NatsRequests, NatsServerProcess, find_binary
from troth_bench.options import (
    NATS_WORKLOADS,
    OPEN_LOOP,
    Options,
    add_bench_flags,
    options_from,
    problems,
)
from troth_bench.otlp_sink import SinkProcess
from troth_bench.pg import (
    backend_pids,
    database_size,
    dbname_of,
    postgres_limits,
    server_version,
    throwaway,
)
from troth_bench.procs import ServerProcess
from troth_bench.profile import Profiler, render
from troth_bench.report import (
    limits_lines,
    mb,
    postgres_target_lines,
    result_lines,
    scale_lines,
    summary_lines,
    target_lines,
)
from troth_bench.results import Limits, Result, ScalePoint
from troth_bench.sdk_load import Phase, Shape, sdk_workflows
from troth_bench.sdk_load import summary_lines as workflow_summary
from troth_bench.sdk_steps import StepRun, sdk_steps
from troth_bench.seed import SeedIds, seed, seed_postgres
from troth_bench.sweep import Curve, chart_of, curve_lines, open_loop
from troth_bench.workloads import RUNNERS, Ctx, reads_of


@dataclass
class Report:
    """Everything one run measured (what ``--json`` writes)."""

    settings: dict[str, Any]
    limits: Limits = field(default_factory=Limits)
    results: list[Result] = field(default_factory=list)
    scale: list[ScalePoint] = field(default_factory=list)
    peers: list[Result] = field(default_factory=list)  # the peer queues (--peers)
    sdk_steps: list[StepRun] = field(default_factory=list)  # --workloads sdk-steps
    sdk_workflows: list[Phase] = field(default_factory=list)  # --workloads sdk-workflows
    open_loop: list[Curve] = field(default_factory=list)  # --open-loop
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
            "peers": [r.to_json() for r in self.peers],
            "sdk_steps": [r.to_json() for r in self.sdk_steps],
            "sdk_workflows": [p.to_json() for p in self.sdk_workflows],
            "open_loop": [c.to_json() for c in self.open_loop],
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
    from troth.engine import MAX_BATCH
    from troth.outbox.types import DispatchConfig
    from troth.server.config import Settings

    server = Settings()
    dispatch = DispatchConfig()
    sqlite_off = bool(opts.url) or opts.store != "sqlite"  # unknown, or no SQLite
    postgres = "-"
    if opts.store == "postgres" or opts.peers:
        try:
            postgres = server_version(opts.postgres_url or opts.postgres_admin)
        except (RuntimeError, psycopg.Error) as exc:
            postgres = f"unreachable ({exc})"
        postgres += " at " + _where(opts.postgres_url or opts.postgres_admin)
        if opts.postgres_url is None:
            postgres += "; a throwaway database per run, dropped after"
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
        "postgres": postgres,
        "nodes": list(opts.nodes) if opts.store == "postgres" else [1],
        "peers": list(opts.peers),
        "nats": "-",  # filled in when the NATS workloads run
    }


def _where(url: str) -> str:
    """host:port/dbname of a connection string, without any password."""
    params = conninfo_to_dict(url)
    host = params.get("host") or "localhost"
    return f"{host}:{params.get('port') or 5432}/{params.get('dbname') or ''}"


def settings_lines(s: dict[str, Any]) -> list[str]:
    nodes = ",".join(str(n) for n in s.get("nodes", [1]))
    server = (
        f"  server:   {s['target']}; store={s['store']} synchronous={s['synchronous']} "
        f"journal={s['journal']}; group commit <= {s['group_commit_max_jobs']} requests per "
        f"transaction; dispatch batch {s['dispatch_batch']}, concurrency "
        f"{s['dispatch_concurrency']}; retry_timeout {s['retry_timeout_ms']} ms; "
        f"access log {s['access_log']}"
    )
    if s["store"] == "postgres":
        server += f"; nodes {nodes} (clients and SSE workers spread round robin)"
    lines = [
        "troth bench",
        f"  software: troth {s['troth']} · {s['python']} · uvicorn {s['uvicorn']} "
        f"(uvloop {s['uvloop']}, httptools {s['httptools']}) · msgspec {s['msgspec']} "
        f"· SQLite {s['sqlite']}",
        f"  machine:  {counted(s['cpus'], 'CPU')} ({s['cpu_model']}), Linux {s['kernel']}",
        f"  storage:  {s['filesystem']}; work dir {s['workdir']}",
        server,
        f"  load:     {counted(s['clients'], 'client')}, "
        f"{counted(s['sse_workers'], 'SSE worker')}; "
        f"warm-up {s['warmup_s']:g} s, window {s['window_s']:g} s per workload; "
        f"generator {s['generator']}",
    ]
    if s.get("postgres", "-") != "-":
        lines.insert(4, f"  database: {s['postgres']}")
    if s.get("nats", "-") != "-":
        lines.append(f"  nats:     {s['nats']}")
    return lines


class Bench:
    """One run: owns the working directory, the servers and databases it starts, the
    output."""

    def __init__(self, opts: Options, out: TextIO) -> None:
        self.opts = opts
        self.out = out
        self.owned_dir = opts.dir is None
        self.workdir = Path(opts.dir or tempfile.mkdtemp(prefix="troth-bench-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.run_id = "b" + secrets.token_hex(3)
        #: Where throwaway databases are created (the given database's server, or the
        #: local cluster): the probes, the peers, and the runs without --postgres-url.
        self.pg_base = opts.postgres_url or opts.postgres_admin
        self.report = Report(describe(opts, self.workdir))
        self.asked_peers = opts.peers
        #: The NATS of the NATS workloads (None: none asked for, or none to be had),
        #: and the nats-server the bench started for them.
        self.nats_url: str | None = None
        self.nats_server: NatsServerProcess | None = None
        #: Where the servers' spans go with --tracing (bench/otlp_sink.py).
        self.sink: SinkProcess | None = None

    def failed(self, exc: BenchFailure) -> None:
        """A verification failed: the run is not ok, and says why."""
        self.report.ok = False
        self.report.failure = str(exc)
        self.say("", f"BENCH FAILED: {exc}")

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
        steps = "sdk-steps" in opts.workloads
        flows = "sdk-workflows" in opts.workloads
        opts = self.opts = replace(
            opts,
            workloads=tuple(w for w in opts.workloads if w not in ("sdk-steps", "sdk-workflows")),
            peers=tuple(p for p in opts.peers if p != "resonate-pg"),
        )
        if (steps or flows) and not (opts.workloads or opts.scale or opts.peers):
            # The limits mean nothing to them: not measured.
            try:
                if steps:
                    await self.sdk_steps()
                if flows:
                    await self.sdk_workflows()
            except BenchFailure as exc:
                self.failed(exc)
            return self.report
        opts = self.opts = self.with_nats(opts)
        self.start_sink()
        limits = self.report.limits
        await self.quiet("the limits")
        if opts.store == "postgres":
            try:
                await self.postgres_limits()
            except (RuntimeError, psycopg.Error) as exc:  # no server, or pgbench failed
                self.report.ok = False
                self.report.failure = str(exc)
                self.say(f"BENCH FAILED: {exc}")
                return self.report
        else:
            await asyncio.to_thread(
                sqlite_limits, self.workdir, opts.synchronous, opts.limit_seconds, limits
            )
        await self.quiet("the bare HTTP round trip")
        await http_limit(self.workdir, opts.clients, opts.limit_seconds, limits)
        await self.quiet("the machine ceiling")
        await self.machine_ceiling()
        self.say(*limits_lines(limits, opts.synchronous), "")
        try:
            if opts.workloads:
                if opts.store == "postgres" and not opts.url:
                    for n in opts.nodes:
                        await self.main_run(n)
                else:
                    await self.main_run()
            for count in opts.scale:
                self.report.scale.append(await self.scale_point(count))
            for peer in opts.peers:
                await self.peer(peer)
            if steps:
                await self.sdk_steps()
            if flows:
                await self.sdk_workflows()
        except BenchFailure as exc:
            self.failed(exc)
        everything = self.report.results + self.report.peers
        if everything:
            self.say(*summary_lines(everything, limits), "")
        if self.report.results:
            self.say(
                f"server RSS at rest {mb(self.report.rss_at_rest)},"
                f" after the workloads {mb(self.report.rss_after)}",
                "",
            )
        if self.report.scale:
            self.say(*scale_lines(self.report.scale), "")
        if opts.store == "postgres" or opts.peers:
            self.say(*postgres_target_lines(self.report.results, self.report.peers, limits))
        else:
            self.say(
                *target_lines(
                    self.report.results,
                    self.report.scale,
                    self.report.settings["cpus"],
                    opts.synchronous,
                    opts.clients,
                )
            )
        self.sink_line()
        if opts.chart and self.report.open_loop:
            self.write_chart(opts.chart)
        if opts.json:
            Path(opts.json).write_text(json.dumps(self.report.to_json(), indent=2))
        return self.report

    def with_nats(self, opts: Options) -> Options:
        """Start a nats-server for the NATS workloads (or take ``--nats-url`` with
        ``--url``); without one, drop them from the run, saying why."""
        wanted = [w for w in opts.workloads if w in NATS_WORKLOADS]
        if not wanted:
            return opts
        why = None
        if opts.url:
            if opts.nats_url:
                self.nats_url = opts.nats_url
                self.report.settings["nats"] = f"{opts.nats_url} (the server's own)"
            else:
                why = "--url without --nats-url (the NATS that server uses)"
        elif (binary := find_binary()) is None:
            why = HOW_TO_GET
        else:
            server = NatsServerProcess(binary, self.workdir)
            try:
                server.start()
            except RuntimeError as exc:
                why = str(exc)
            else:
                self.nats_server, self.nats_url = server, server.url
                self.report.settings["nats"] = (
                    f"{server.version()} at {server.url}, started by the bench (core NATS);"
                    " troth serve --nats-url; requests with a Resonate-Reply-To inbox, as"
                    " the SDKs' NATS connector sends them"
                )
        if why is None:
            self.say(*settings_lines(self.report.settings)[-1:], "")
            return opts
        self.say(f"skipping {', '.join(wanted)}: {why}", "")
        return replace(opts, workloads=tuple(w for w in opts.workloads if w not in wanted))

    def nats_flags(self) -> list[str]:
        """What the servers the bench starts are given for NATS (and ``--tracing``)."""
        flags = ["--nats-url", self.nats_url] if self.nats_url and not self.opts.url else []
        return flags + (["--tracing"] if self.sink is not None else [])

    def trace_env(self) -> dict[str, str] | None:
        """The servers' exporter settings with --tracing: to the bench's sink."""
        if self.sink is None:
            return None
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": self.sink.url, "OTEL_SERVICE_NAME": "troth-bench"}
        if self.opts.tracing < 1:
            env["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
            env["OTEL_TRACES_SAMPLER_ARG"] = str(self.opts.tracing)
        return env

    def start_sink(self) -> None:
        """--tracing: the sink the servers export to, started once per run."""
        if self.opts.tracing <= 0 or self.opts.url or self.sink is not None:
            return
        sink = SinkProcess(self.workdir)
        sink.start()
        self.sink = sink
        ratio = self.opts.tracing
        share = "every workflow" if ratio >= 1 else f"{ratio:g} of workflows"
        self.report.settings["tracing"] = f"on, {share} sampled: OTLP/HTTP to {sink.url}"
        self.say(
            f"  tracing:  on (troth serve --tracing), {share} sampled; spans exported over"
            " OTLP/HTTP to a sink the bench runs, which drops them",
            "",
        )

    def sink_line(self) -> None:
        if self.sink is not None:
            got = self.sink.stats()
            self.say(
                f"tracing: the servers exported {got['exports']:,} batches of spans"
                f" ({got['bytes'] / 2**20:,.1f} MB) to the sink"
            )

    def write_chart(self, path: str) -> None:
        s = self.report.settings
        caption = (
            f"troth bench --open-loop · store={s['store']} synchronous={s['synchronous']}"
            f" · {s['cpus']} CPUs · {s['python']} · window {s['window_s']:g} s per rate"
        )
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(chart_of(self.report.open_loop, caption))
        self.say(f"open-loop chart written to {path}")

    async def sdk_steps(self) -> None:
        """The published SDKs' step latency (``troth_bench.sdk_steps``)."""
        opts = self.opts
        await self.quiet("sdk-steps")
        self.say(
            f"-- sdk-steps: workflows of {opts.steps:,} sequential ctx.run steps "
            + "-" * max(0, 18 - len(f"{opts.steps:,}"))
        )
        try:
            self.report.sdk_steps = await sdk_steps(
                opts.steps, opts.sdks, opts.sdk_stores, self.workdir, self.pg_base, self.say
            )
        except RuntimeError as exc:
            raise BenchFailure(f"sdk-steps: {exc}") from exc
        if self.report.sdk_steps:
            self.say(
                "  note: step = gap between two consecutive steps' starts, in the SDK's"
                " process; troth ms/step = its troth_request_seconds over the workflow"
                " ÷ steps; share = that ÷ the mean step",
            )
        self.say("")

    async def machine_ceiling(self) -> None:
        """nginx driven by wrk and by the generator (``troth_bench.ceiling``)."""
        limits, opts = self.report.limits, self.opts
        try:
            found = await machine_ceiling(self.workdir, opts.clients, opts.limit_seconds)
        except RuntimeError as exc:  # nginx or wrk misbehaved: the run goes on without
            limits.nginx_skipped = str(exc)
            return
        limits.nginx_skipped = found.skipped
        limits.nginx_wrk, limits.nginx_generator = found.wrk, found.generator
        limits.nginx_cpu = found.nginx_cpu
        limits.nginx_generator_cpu = found.generator_cpu.generator

    async def sdk_workflows(self) -> None:
        """The Python SDK's workflows under load, beside resonate-pg
        (``troth_bench.sdk_load``)."""
        opts = self.opts
        await self.quiet("sdk-workflows")
        shape = Shape(
            opts.wf_steps,
            opts.wf_count,
            opts.wf_inflight,
            opts.sdk_processes,
            opts.wf_single,
            opts.rounds,
        )
        sql = opts.resonate_sql if "resonate-pg" in self.asked_peers else None
        try:
            self.report.sdk_workflows = await sdk_workflows(
                shape, opts.wf_stores, sql, self.workdir, self.pg_base, self.say
            )
        except (RuntimeError, psycopg.Error) as exc:
            raise BenchFailure(f"sdk-workflows: {exc}") from exc
        self.say(
            "  note: step = gap between two consecutive steps' starts in the SDK process;"
            " wf p50 = a workflow's wall time; cores = CPU seconds ÷ phase seconds"
            " (postgres: the target database's backends, WAL writer, checkpointer)",
            *workflow_summary(self.report.sdk_workflows),
            "",
        )

    async def postgres_limits(self) -> None:
        """Raw durable commits on the same PostgreSQL server (see :mod:`troth_bench.pg`):
        directly, at ``--postgres-listen-url`` when given, since pgbench's prepared
        statements and clients do not pass a pooler the way troth's nodes do."""
        limits = self.report.limits
        base = self.opts.postgres_listen_url or self.pg_base
        found = await asyncio.to_thread(
            postgres_limits, base, self.opts.clients, self.opts.limit_seconds, self.workdir
        )
        limits.pg_method = found["method"]
        limits.pg_clients = self.opts.clients
        limits.pg_commits = found["commits"]
        limits.pg_commit_latency = found["commits_latency"]
        limits.pg_serial = found["serial"]
        limits.pg_serial_latency = found["serial_latency"]
        limits.pg_rows = found["rows"]

    async def main_run(self, nodes: int = 1) -> None:
        """The workloads on one server, or on ``nodes`` servers sharing a PostgreSQL
        database (a fresh throwaway one unless --postgres-url named one)."""
        opts = self.opts
        if opts.url:
            host, port = split_url(opts.url)
            results = await self.workloads(host, port, None, opts, self.run_id, None)
            self.report.results.extend(results)
            return
        if opts.store != "postgres":
            server = ServerProcess.troth(
                self.workdir,
                self.workdir / "troth.db",
                synchronous=opts.synchronous,
                store=opts.store,
                extra=self.nats_flags(),
                env=self.trace_env(),
            )
            await self.on_servers([server], None, self.run_id, "")
            return
        label = f"{nodes} node" + ("s" if nodes > 1 else "")
        run = f"{self.run_id}n{nodes}"
        if opts.postgres_url:
            await self.on_database(opts.postgres_url, nodes, run, label)
        else:
            with throwaway(self.pg_base) as url:
                await self.on_database(url, nodes, run, label)

    async def on_database(self, url: str, nodes: int, run: str, label: str) -> None:
        self.say(f"{label} on PostgreSQL database {_where(url)}", "")
        one_port = self.opts.one_port and nodes > 1
        servers = [
            ServerProcess.troth(
                self.workdir / f"{run}-node{k}",
                self.workdir / "unused.db",
                synchronous=self.opts.synchronous,
                postgres_url=url,
                extra=self.nats_flags()
                + self.pool_flags()
                + (["--workers", str(nodes)] if one_port else []),
                env=self.trace_env(),
            )
            for k in range(1 if one_port else nodes)
        ]
        await self.on_servers(servers, url, run, label if self.opts.store == "postgres" else "")

    def pool_flags(self) -> list[str]:
        """The nodes' pooler settings (``--postgres-pool-mode``, ``--postgres-listen-url``)."""
        flags = ["--postgres-pool-mode", self.opts.postgres_pool_mode]
        if self.opts.postgres_listen_url:
            flags += ["--postgres-listen-url", self.opts.postgres_listen_url]
        return flags

    async def on_servers(
        self, servers: list[ServerProcess], url: str | None, run: str, label: str
    ) -> None:
        """Start ``servers`` (the first alone: it creates or upgrades the schema), run
        the workloads spread over them, stop them."""
        try:
            await servers[0].start()
            await asyncio.gather(*(s.start() for s in servers[1:]))
            pids = [pid for s in servers for pid in s.serving_pids()]
            nodes = [("127.0.0.1", s.port) for s in servers]
            at_rest = [rss_bytes(pid) for pid in pids]
            self.report.rss_at_rest = sum(v for v in at_rest if v) or None
            db_pids = self.db_pids(url) if url else None
            results = await self.workloads(
                "127.0.0.1",
                servers[0].port,
                pids[0] if len(pids) == 1 else pids,
                self.opts,
                run,
                servers,
                context=label,
                nodes=nodes,
                db_pids=db_pids,
            )
            self.report.results.extend(results)
            after = [rss_bytes(pid) for pid in pids]
            self.report.rss_after = sum(v for v in after if v) or None
        finally:
            codes = [s.stop() for s in servers]
            for server, code in zip(servers, codes, strict=True):
                if code != 0 and self.report.ok:
                    raise BenchFailure(f"server exited with {code}: {server.tail()}")

    def db_pids(self, url: str) -> DbPids:
        """PostgreSQL's processes working for database ``url`` (charged to the run)."""
        base, name = self.pg_base, dbname_of(url)
        return lambda: backend_pids(base, [name])

    async def workloads(
        self,
        host: str,
        port: int,
        pid: int | list[int] | None,
        opts: Options,
        run: str,
        servers: list[ServerProcess] | None,
        names: tuple[str, ...] | None = None,
        read_ids: Sequence[str] | None = None,
        sink: list[Result] | None = None,
        context: str = "",
        nodes: list[tuple[str, int]] | None = None,
        db_pids: DbPids | None = None,
    ) -> list[Result]:
        """Run workloads with one set of N connections, spread over the nodes."""
        nodes = nodes or [(host, port)]
        clients = [
            await Client.open(*nodes[i % len(nodes)], f"{run}-c{i}") for i in range(opts.clients)
        ]
        spare = await Client.open(host, port, f"{run}-spare")
        ctx = Ctx(
            host,
            port,
            opts,
            run,
            clients,
            spare,
            pid,
            # One port over several processes (--one-port): each scrape of /metrics
            # reaches whichever child accepts it, so commit counts cannot be summed.
            metrics_url=None if isinstance(pid, list) and len(pid) > len(nodes) else (host, port),
            nodes=nodes,
            db_pids=db_pids,
        )
        wanted = names or opts.workloads
        if self.nats_url and any(w in NATS_WORKLOADS for w in wanted):
            ctx.nats_url = self.nats_url
            ctx.nats_requests = await NatsRequests.connect(self.nats_url)
            await ctx.nats_requests.ready(30.0)
        profiler = None
        first = pid[0] if isinstance(pid, list) else pid
        if opts.profile and first is not None:
            profiler = Profiler(Path(opts.profile) / run, first, opts.profile_mode)
            ctx.on_window = profiler.during
        results: list[Result] = [] if sink is None else sink
        try:
            for name in names or opts.workloads:
                await self.quiet(name)
                if name == "reads" and read_ids is not None:
                    got: Result | list[Result] = await reads_of(ctx, read_ids, "resolved")
                else:
                    got = await RUNNERS[name](ctx)
                for server in servers or []:
                    if not server.alive():
                        raise BenchFailure(f"server died during {name}: {server.tail()}")
                for k, result in enumerate(got if isinstance(got, list) else [got]):
                    # Its own (handoff: the limit), then the run's (postgres: the nodes).
                    result.context = ", ".join(c for c in (result.context, context) if c)
                    # Server processes: a --workers supervisor's children count one each.
                    result.nodes = max(len(nodes), len(pid) if isinstance(pid, list) else 1)
                    results.append(result)
                    self.say(*([""] if k else []), *result_lines(result, self.report.limits))
                if profiler is not None:
                    if name in profiler.profiles:
                        self.say(*render(name, profiler.profiles[name]))
                    elif name in profiler.errors:
                        self.say(f"  profile: {profiler.errors[name]}")
                self.say("")
                if opts.open_loop and name in OPEN_LOOP and names is None:
                    curve = await open_loop(ctx, name, result, self.quiet)
                    curve.context = context
                    self.report.open_loop.append(curve)
                    self.say(*curve_lines(curve), "")
        finally:
            for c in [*clients, *ctx.extra, spare]:
                c.close()
            if ctx.nats_requests is not None:
                await ctx.nats_requests.close()
        return results

    async def scale_point(self, count: int) -> ScalePoint:
        """A fresh server on a database seeded with ``count`` settled promises."""
        if self.opts.store == "postgres":
            with throwaway(self.pg_base, "troth_bench_scale") as url:
                return await self._scale_point(count, url)
        return await self._scale_point(count, None)

    async def _scale_point(self, count: int, url: str | None) -> ScalePoint:
        opts = self.opts
        directory = self.workdir / f"scale-{count}"
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        db = directory / "troth.db"
        if url is None:
            self.say(f"scale: seeding {count:,} settled promises into {db} ...")
            seconds = await asyncio.to_thread(seed, db, count, "s-")
            size = sum(
                Path(f"{db}{s}").stat().st_size for s in ("", "-wal") if Path(f"{db}{s}").exists()
            )
        else:
            self.say(f"scale: seeding {count:,} settled promises into {_where(url)} ...")
            seconds = await asyncio.to_thread(seed_postgres, url, count, "s-")
            size = await asyncio.to_thread(database_size, url)
        self.say(f"scale: seeded in {seconds:.1f} s, {size / 2**20:,.0f} MB")
        server = ServerProcess.troth(
            directory, db, synchronous=opts.synchronous, store=opts.store, postgres_url=url
        )
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
                [server],
                names=("reads", "create-settle", "lifecycle"),
                read_ids=ids,
                sink=point.results,
                context=f"{count:,} stored",
                db_pids=self.db_pids(url) if url else None,
            )
            point.rss_after = rss_bytes(server.pid)
        finally:
            code = server.stop()
            if not opts.keep:
                shutil.rmtree(directory, ignore_errors=True)
        if code != 0:
            raise BenchFailure(f"scale server exited with {code}: {server.tail()}")
        return point

    async def peer(self, name: str) -> None:
        """The peer queue on the same PostgreSQL server (see :mod:`troth_bench.peers`)."""
        from troth_bench import peers

        opts = self.opts
        why = peers.missing(name)
        if why is not None:
            raise BenchFailure(why)
        for producers in opts.peer_producers or (opts.clients,):
            await self.quiet(f"{name} single")
            result = await peers.single(
                self.pg_base, opts, producers, 1, self.workdir, opts.peer_inflight
            )
            self.report.peers.append(result)
            self.say(*result_lines(result, self.report.limits), "")
        await self.quiet(f"{name} batched")
        result = await peers.batched(self.pg_base, opts, self.workdir)
        self.report.peers.append(result)
        self.say(*result_lines(result, self.report.limits), "")

    def cleanup(self) -> None:
        if self.nats_server is not None:
            self.nats_server.stop()
        if self.sink is not None:
            self.sink.stop()
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
    """Entry point for ``troth bench``: exit status 1 when a verification failed, 2 when
    the flags cannot be honoured (or a peer's package is missing: nothing is run)."""
    opts = options_from(args)
    if getattr(args, "hold_horizon", None) is not None:
        return hold_horizon(opts, args.hold_horizon)
    wrong = problems(opts)
    if "pgqueuer" in opts.peers:
        from troth_bench.peers import missing

        wrong += [m for m in (missing("pgqueuer"),) if m]
    if "resonate-pg" in opts.peers:
        from troth_bench.sdk_load import sql_problem

        wrong += [m for m in (sql_problem(opts.resonate_sql),) if m]
    if wrong:
        for line in wrong:
            print(f"troth bench: {line}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    report = run(opts)
    print(f"\nbench took {time.perf_counter() - started:.0f} s", flush=True)
    return 0 if report.ok else 1


def hold_horizon(opts: Options, seconds: float) -> int:
    """``--hold-horizon``: :mod:`troth_bench.horizon` with the bench's clients, workers,
    PostgreSQL server and peers."""
    if opts.store != "postgres":
        print("troth bench: --hold-horizon needs --store postgres", file=sys.stderr)
        return 2
    argv = ["--hold", f"{seconds:g}", "--clients", str(opts.clients)]
    argv += ["--workers", str(opts.workers), "--postgres-admin", opts.postgres_admin]
    if "pgqueuer" in opts.peers:
        argv += ["--peer", "pgqueuer", "--producers", str(opts.clients)]
    return horizon.main(argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="troth bench", description=__doc__)
    add_bench_flags(parser)
    return run_from_args(parser.parse_args(argv))
