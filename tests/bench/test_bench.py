"""``troth bench`` keeps working: every workload runs tiny (seconds) and verifies itself.

CI does not judge speed; these tests check that each workload drives a real server
over HTTP and SSE, that its verification passed, that the tables are printed, and
that a wrong answer fails the run instead of producing figures.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers.pg import ADMIN_URL
from troth_bench import drivers, peers, runner, sdk_steps, workloads
from troth_bench import pg as bench_pg
from troth_bench.client import BenchFailure, Client
from troth_bench.measure import Probe, Samples, Window
from troth_bench.options import WORKLOADS, Options
from troth_bench.pg import as_uri, url_of
from troth_bench.profile import summarize
from troth_bench.report import postgres_target_lines
from troth_bench.results import Limits, Result, Series
from troth_bench.runner import settings_lines
from troth_bench.workloads import Ledger

TINY = Options(
    clients=4,
    warmup=0.2,
    duration=0.6,
    workers=2,
    children=3,
    reads_ids=100,
    timers=200,
    timer_spread=0.5,
    hb_tasks=50,
    hb_workers=5,
    limit_seconds=0.3,
    scale=(300,),
    scale_seconds=0.5,
    op_timeout=20,
)


def test_every_workload_runs_tiny_and_verifies(tmp_path: Path) -> None:
    out = io.StringIO()
    report = runner.run(replace(TINY, dir=str(tmp_path), json=str(tmp_path / "r.json")), out)
    text = out.getvalue()
    assert report.ok, text
    assert [r.name for r in report.results] == list(WORKLOADS)
    for r in report.results:
        assert r.checks, r.name  # each workload read its own results back
        assert f"-- {r.name} " in text
        head = r.line(r.headline)
        assert head is not None and head.count > 0, (r.name, text)
    lifecycle = next(r for r in report.results if r.name == "lifecycle")
    assert lifecycle.line("dispatch") is not None
    assert lifecycle.line("dispatch").latency["p50"] >= 0  # type: ignore[union-attr]
    timers = next(r for r in report.results if r.name == "timers")
    assert timers.line("lag").count == TINY.timers  # type: ignore[union-attr]
    # The limits were measured, and the figures are printed as ratios to them.
    assert report.limits.sqlite_commits and report.limits.sqlite_rows
    assert report.limits.http is not None and report.limits.http.count > 0
    assert "x bare HTTP" in text and "1-row SQLite commits" in text
    # Settings in force, summary, scale and targets tables.
    for needle in ("synchronous=full", "group commit", "summary", "scale ("):
        assert needle in text, needle
    assert "troth's targets (stated for 2 cores" in text
    assert report.rss_at_rest and report.rss_at_rest > 0
    assert report.scale and report.scale[0].stored == 300
    assert {r.name for r in report.scale[0].results} == {"reads", "create-settle", "lifecycle"}
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["ok"] is True and len(data["results"]) == len(WORKLOADS)


def test_troth_bench_command(tmp_path: Path) -> None:
    """The CLI entry point: ``troth bench`` exits 0 and prints the tables."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "troth.cli.main",
            "bench",
            "--workloads",
            "create-settle",
            "--clients",
            "4",
            "--warmup",
            "0.2",
            "--duration",
            "0.5",
            "--limit-seconds",
            "0.2",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "-- create-settle" in proc.stdout
    assert "verified:" in proc.stdout
    assert "summary" in proc.stdout


def test_a_failed_verification_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def wrong(ctx: workloads.Ctx) -> workloads.Result:
        raise BenchFailure("expected 10 promises resolved, the server holds {'pending': 10}")

    monkeypatch.setitem(workloads.RUNNERS, "create-settle", wrong)
    out = io.StringIO()
    opts = replace(TINY, dir=str(tmp_path), scale=(), workloads=("create-settle",))
    report = runner.run(opts, out)
    assert not report.ok
    assert "BENCH FAILED" in out.getvalue()


def test_a_reply_for_another_request_is_refused() -> None:
    """A server that answers fast but with someone else's corrId fails the bench."""

    async def scenario() -> str:
        body = b'{"kind":"promise.get","head":{"corrId":"other","status":200},"data":{}}'

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = await Client.open("127.0.0.1", port, "t")
        try:
            with pytest.raises(BenchFailure) as exc:
                await client.call("promise.get", {"id": "x"})
            return str(exc.value)
        finally:
            client.close()
            server.close()

    assert "reply is for promise.get other" in asyncio.run(scenario())


def test_ledger_refuses_a_second_acquisition_and_fulfilment() -> None:
    ledger = Ledger()
    acquired = {"task": {"id": "t", "state": "acquired", "version": 1}}
    assert ledger.acquired(acquired, "t") == 1
    with pytest.raises(BenchFailure, match="acquired twice"):
        ledger.acquired(acquired, "t")
    settled = {"promise": {"id": "t", "state": "resolved"}}
    ledger.fulfil(settled, "t")
    with pytest.raises(BenchFailure, match="fulfilled twice"):
        ledger.fulfil(settled, "t")
    with pytest.raises(BenchFailure, match="not resolved"):
        ledger.fulfil({"promise": {"id": "u", "state": "pending"}}, "u")


def test_percentiles_are_nearest_rank_in_ms() -> None:
    s = Samples([k / 1000 for k in range(1, 101)])  # 1..100 ms
    assert s.percentiles() == {"p50": 50.0, "p90": 90.0, "p99": 99.0, "max": 100.0}
    assert Samples().percentiles() == {}


def test_profile_summary_counts_self_and_total_per_thread() -> None:
    raw = (
        "thread (1): MainThread;handle (a/site-packages/uvicorn/x.py:3);f (/w/src/troth/a.py:10) 3\n"
        "thread (1): MainThread;handle (a/site-packages/uvicorn/x.py:3);g (/w/src/troth/a.py:20) 1\n"
        "thread (2): troth-writer;commit (/w/src/troth/store/sqlite.py:5) 4\n"
    )
    threads = summarize(raw)
    main = threads["MainThread"]
    assert main.samples == 4
    assert main.top("self", 5) == [("f (troth/a.py)", 0.75), ("g (troth/a.py)", 0.25)]
    assert dict(main.top("total", 5))["handle (uvicorn/x.py)"] == 1.0
    assert threads["troth-writer"].top("self", 1) == [("commit (troth/store/sqlite.py)", 1.0)]


# -- PostgreSQL ------------------------------------------------------------------------

PG_TINY = replace(TINY, store="postgres", postgres_admin=ADMIN_URL, limit_seconds=1)


def bench_databases() -> set[str]:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'troth_bench%'")
        return {r[0] for r in rows.fetchall()}


def test_every_workload_runs_tiny_on_postgres_and_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One node on a throwaway database: every workload, the PostgreSQL ceilings, a
    seeded scale point; the databases it made are gone afterwards (its own, by name:
    tests on other workers make and drop theirs meanwhile)."""
    made: list[str] = []
    create = bench_pg.create_database

    def recorded(base: str, prefix: str = "troth_bench", *, hint: str = bench_pg.BENCH_HINT) -> str:
        url = create(base, prefix, hint=hint)
        made.append(bench_pg.dbname_of(url))
        return url

    monkeypatch.setattr(bench_pg, "create_database", recorded)
    out = io.StringIO()
    report = runner.run(replace(PG_TINY, dir=str(tmp_path)), out)
    text = out.getvalue()
    assert report.ok, text
    assert [r.name for r in report.results] == list(WORKLOADS)
    for r in report.results:
        assert r.checks, r.name
        assert r.context == "1 node" and f"-- {r.name} (1 node)" in text
        head = r.line(r.headline)
        assert head is not None and head.count > 0, (r.name, text)
        assert r.cpu.database is not None  # PostgreSQL's processes are charged to the run
    limits = report.limits
    assert limits.pg_commits and limits.pg_serial and limits.pg_rows
    assert limits.pg_commit_latency["p50"] > 0
    assert "raw PostgreSQL, 1 row per commit, 4 connections" in text
    assert "1-row PostgreSQL commits" in text and "troth's PostgreSQL targets" in text
    assert report.scale and report.scale[0].stored == 300 and report.scale[0].db_bytes > 0
    assert made and not set(made) & bench_databases(), made


@pytest.mark.parametrize("one_port", [False, True], ids=["two-servers", "workers-2"])
def test_two_nodes_share_the_database(tmp_path: Path, one_port: bool) -> None:
    """create-settle over two nodes (clients alternate between them, or one
    ``troth serve --workers 2`` spreads them): every promise one node wrote is read
    back, resolved, through the other's census.  (The run without its limits: those
    are covered above.)"""
    import uvloop

    out = io.StringIO()
    opts = replace(
        PG_TINY,
        dir=str(tmp_path),
        nodes=(2,),
        workloads=("create-settle",),
        scale=(),
        one_port=one_port,
    )
    bench = runner.Bench(opts, out)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as loop:
        loop.run(bench.main_run(2))
    text = out.getvalue()
    (result,) = bench.report.results
    assert result.nodes == 2 and result.context == "2 nodes"
    assert result.checks and "summed over 2 nodes" in text
    if one_port:  # one /metrics through the shared port: a random child's, not summed
        assert result.commits_per_s is None
    else:
        assert result.commits_per_s is not None  # both nodes' counters, summed
    assert result.cpu.server is not None and result.cpu.server > 0


def test_a_missing_peer_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = peers.importlib.import_module

    def without_pgqueuer(name: str, package: str | None = None) -> object:
        if name == "pgqueuer":
            raise ImportError("No module named 'pgqueuer'")
        return real(name, package)

    monkeypatch.setattr(peers.importlib, "import_module", without_pgqueuer)
    why = peers.missing("pgqueuer")
    assert why is not None and "pip install -e './bench[pgqueuer]'" in why
    # The command refuses (exit 2) before it starts or measures anything.
    parser = runner.argparse.ArgumentParser()
    runner.add_bench_flags(parser)
    args = parser.parse_args(["--store", "postgres", "--peers", "pgqueuer"])
    assert runner.run_from_args(args) == 2


def test_pgqueuer_peer_runs_tiny_and_verifies(tmp_path: Path) -> None:
    """The peer's harness, when the optional extra is installed (not in CI's install)."""
    pytest.importorskip("pgqueuer")
    pytest.importorskip("asyncpg")
    # The window counts completions only: 2 s, since a consumer on a loaded machine may
    # take most of a second to report its first (0.5 s once saw none).
    opts = replace(PG_TINY, warmup=0.2, duration=2.0, peer_jobs=300, peer_batch=50)

    async def both() -> tuple[Result, Result]:
        one = await peers.single(ADMIN_URL, opts, 4, 1, tmp_path, inflight=4)
        return one, await peers.batched(ADMIN_URL, opts, tmp_path)

    single, batched = asyncio.run(both())
    assert single.checks and single.line("jobs").count > 0  # type: ignore[union-attr]
    assert batched.checks and batched.line("drain").count == 300  # type: ignore[union-attr]


def test_postgres_targets_compare_nodes_and_the_peer() -> None:
    def result(name: str, nodes: int, line: str, count: int) -> Result:
        return Result(name, line, [Series(line, "x", count, 1.0)], nodes=nodes)

    results = [result("lifecycle", 1, "tasks", 900), result("lifecycle", 2, "tasks", 1500)]
    peer = Result("pgqueuer single", "jobs", [Series("jobs", "job", 1000, 1.0)], peer="pgqueuer")
    text = "\n".join(postgres_target_lines(results, [peer], Limits()))
    assert "900 tasks/s vs 1,000 jobs/s" in text and "NOT MET" in text
    assert "1,500 vs 900 tasks/s" in text and text.count(" met") == 1


def test_connection_strings_become_uris_for_asyncpg() -> None:
    url = url_of("postgresql://postgres@127.0.0.1:5432/postgres", "troth_bench_x")
    assert as_uri(url) == "postgresql://postgres@127.0.0.1:5432/troth_bench_x"
    assert as_uri("host=/run/pg dbname=a user=u password=p@s") == (
        "postgresql://u:p%40s@/a?host=%2Frun%2Fpg"
    )


def test_postgres_ceilings_without_pgbench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where pgbench is not on PATH, a psycopg insert loop measures the same three
    ceilings, and says so."""
    monkeypatch.setattr(bench_pg, "find_pgbench", lambda: None)
    found = bench_pg.postgres_limits(ADMIN_URL, 2, 0.2, tmp_path)
    assert found["method"] == "psycopg insert loop"
    assert found["commits"] > 0 and found["serial"] > 0 and found["rows"] > 0
    assert found["commits_latency"]["p50"] > 0


def test_driver_comparison_runs_psycopg_and_reports_it() -> None:
    """The psycopg half of ``python -m troth_bench.drivers`` (asyncpg is the bench
    extra's): it really commits, and the report carries its figure."""
    with bench_pg.throwaway(ADMIN_URL) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(drivers._SETUP)
        figure = drivers.run_psycopg(url, "off", 0.3)
        with psycopg.connect(url) as conn:
            stored = conn.execute("SELECT count(*), max(n) FROM drivers_bench").fetchone()
    assert figure.transactions > 10 and figure.per_second > 0
    assert stored == (min(figure.transactions, drivers.IDS), figure.transactions - 1)
    assert "psycopg   off" in drivers.report([figure])


def test_inproc_runs_every_workload_through_the_store_and_refuses_unknown_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from troth_bench import inproc

    for name in inproc.WORKLOADS:
        # Each step raises if a request is refused or a claimed row cannot be settled.
        assert inproc.measure(name, 2 * inproc.BATCH) > 0
    assert inproc.main(["lifecycle", "64"]) == 0
    assert "µs CPU per request (64 promises)" in capsys.readouterr().out
    assert inproc.main(["nonsense"]) == 2


def test_sdk_steps_runs_tiny_with_the_sdks_found(tmp_path: Path) -> None:
    """``--workloads sdk-steps`` with a 5-step workflow on the memory store: each SDK
    found in ``.sdk-cache/`` runs in-process and against troth, every step is timed,
    and troth's share is read from its metrics (2 fences per step).  Skips where the
    SDK tests have not built the SDKs."""
    found = sdk_steps.Programs.find()
    if not (found.available("python") or found.available("typescript")):
        pytest.skip("no SDK in .sdk-cache/ (the SDK tests build them)")
    out = io.StringIO()
    opts = replace(TINY, dir=str(tmp_path), workloads=("sdk-steps",), steps=5)
    report = runner.run(replace(opts, sdk_stores=("memory",)), out)
    text = out.getvalue()
    assert report.ok, text
    assert "-- sdk-steps" in text and "troth share" in text
    sdks = [s for s in sdk_steps.SDKS if found.available(s)]
    assert [(r.sdk, r.where) for r in report.sdk_steps] == [
        *((s, "in-process") for s in sdks),
        *((s, "troth memory") for s in sdks),
    ]
    for r in report.sdk_steps:
        assert r.steps == 5 and len(r.gaps_ms) == 4 and all(g >= 0 for g in r.gaps_ms)
        if r.where == "in-process":
            assert r.server_ms is None
        else:
            assert r.requests.get("task.fence") == 10, r.requests
            assert r.server_ms is not None and r.server_ms > 0


def test_sdk_steps_skips_a_missing_sdk_with_how_to_install_it(tmp_path: Path) -> None:
    lines: list[str] = []
    runs = asyncio.run(
        sdk_steps.sdk_steps(
            5,
            sdk_steps.SDKS,
            ("memory",),
            tmp_path,
            ADMIN_URL,
            lambda *said: lines.extend(said),
            sdk_steps.Programs(None, None),
        )
    )
    assert runs == []
    assert any("skipping the python SDK" in line and "pip install" in line for line in lines)
    assert any("skipping the typescript SDK" in line and "npm install" in line for line in lines)


def test_the_nats_workloads_run_beside_the_http_ones(tmp_path: Path) -> None:
    """create-settle-nats and lifecycle-nats against a nats-server the bench starts
    itself: requests over troth's queue group, executes to ``nats://`` subjects; each
    verifies itself and reports a positive rate beside its HTTP twin."""
    from helpers.nats import require_binary

    require_binary()  # skips, saying how to get it, without nats-server
    out = io.StringIO()
    names = ("create-settle", "create-settle-nats", "lifecycle-nats")
    opts = replace(TINY, dir=str(tmp_path), scale=(), workloads=names)
    report = runner.run(opts, out)
    text = out.getvalue()
    assert report.ok, text
    assert [r.name for r in report.results] == list(names)
    for r in report.results:
        head = r.line(r.headline)
        assert head is not None and head.count > 0 and (head.rate or 0) > 0, (r.name, text)
        assert r.checks, r.name
    lifecycle = report.results[-1]
    assert any("acquired once and fulfilled once" in c for c in lifecycle.checks)
    assert "nats-server" in text and "started by the bench" in text
    assert report.settings["nats"].startswith("nats-server")


def test_without_nats_server_the_nats_workloads_are_skipped_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "find_binary", lambda: None)
    out = io.StringIO()
    opts = replace(TINY, dir=str(tmp_path), scale=(), workloads=("create-settle", "lifecycle-nats"))
    report = runner.run(opts, out)
    text = out.getvalue()
    assert report.ok, text
    assert [r.name for r in report.results] == ["create-settle"]
    assert "skipping lifecycle-nats: nats-server not found" in text


@pytest.mark.parametrize("ratio", [1.0, 0.5])
def test_tracing_runs_export_to_the_bench_sink(tmp_path: Path, ratio: float) -> None:
    """``--tracing [RATIO]``: the server runs with tracing on, its spans go to the
    bench's own OTLP sink (which counts what it got), a ratio below 1 samples."""
    pytest.importorskip("opentelemetry.sdk", reason="tracing needs the otel extra")
    out = io.StringIO()
    opts = replace(TINY, dir=str(tmp_path), workloads=("create-settle",), tracing=ratio)
    report = runner.run(opts, out)
    text = out.getvalue()
    assert report.ok, text
    share = "every workflow" if ratio == 1 else "0.5 of workflows"
    assert f"tracing:  on (troth serve --tracing), {share} sampled" in text
    exported = re.search(r"the servers exported ([\d,]+) batches of spans", text)
    assert exported is not None and int(exported[1].replace(",", "")) > 0, text


class Every(dict[str, Any]):
    """Bench settings where every value is ``value`` (the lines only format them)."""

    def __init__(self, value: int) -> None:
        super().__init__()
        self.value = value

    def __missing__(self, key: str) -> Any:
        return self.value


@pytest.mark.parametrize(
    ("value", "machine", "load"),
    [
        (1, "  machine:  1 CPU (1)", "  load:     1 client, 1 SSE worker;"),
        (2, "  machine:  2 CPUs (2)", "  load:     2 clients, 2 SSE workers;"),
    ],
)
def test_the_bench_says_one_client_and_one_cpu(value: int, machine: str, load: str) -> None:
    lines = settings_lines(Every(value))
    assert any(line.startswith(machine) for line in lines), lines
    assert any(line.startswith(load) for line in lines), lines


def test_the_probe_measures_the_whole_window_however_slow_the_snapshot() -> None:
    """The server's CPU is read at the window's edge, before the opening snapshot (a
    request to each node): on a busy machine that snapshot took longer than a tiny
    run's window, and the CPU read after it covered nothing (a server share of 0)."""

    async def slow_snapshot() -> dict[str, float]:
        await asyncio.sleep(0.5)
        return {}

    async def probe_a_busy_process(pid: int) -> Probe:
        window = Window(0.0, 0.3)
        window.start()
        probe = Probe(window, pid, snapshot=slow_snapshot)
        probe.start()
        await probe.finish()
        return probe

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        probe = asyncio.run(probe_a_busy_process(busy.pid))
    finally:
        busy.kill()
        busy.wait()
    assert probe.seconds >= 0.3, probe.seconds
    assert probe.cpu.server is not None and probe.cpu.server > 0.1, probe.cpu
