"""``troth bench`` flags and the settings a run is made with.

Kept free of heavy imports: ``troth.cli.main`` imports it to build its parser, and
``troth serve`` must not pay for the bench at start-up.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

WORKLOADS = ("create-settle", "lifecycle", "fanout", "reads", "timers", "heartbeat")
#: Workloads run only when named: ``sdk-steps`` needs the published SDKs, which are
#: not troth's dependencies, and starts servers of its own (troth_bench.sdk_steps).
NAMED_ONLY = ("sdk-steps", "sdk-workflows")
#: The HTTP workload of the same name with requests over troth's NATS queue group
#: (and, for lifecycle, executes delivered to ``nats://`` subjects): run only when
#: named, beside the HTTP ones; the bench starts its own nats-server for them
#: (troth_bench.nats), or skips them saying why when there is none.
NATS_WORKLOADS = ("create-settle-nats", "lifecycle-nats")
#: Flow control (troth_bench.workloads.handoff): a limited group's freed slot to its
#: next ``execute``, and lifecycle beside a limit; run only when named.
FLOW_WORKLOADS = ("handoff",)
SDKS = ("python", "typescript")
SDK_STORES = ("sqlite", "memory", "postgres")
PEERS = ("pgqueuer", "resonate-pg")
#: sdk-workflows: the troth stores it runs against (resonate-pg joins with --peers).
WF_STORES = ("sqlite", "postgres")
#: Workloads with an open-loop form (``--open-loop``; troth_bench.sweep).
OPEN_LOOP = ("create-settle", "lifecycle")
#: ``--open-loop sweep``: percentages of the closed-loop maximum.
SWEEP = (25.0, 50.0, 75.0, 90.0, 100.0)
ARRIVALS = ("uniform", "poisson")


@dataclass(frozen=True)
class Offered:
    """One open-loop load: operations/s, or a percentage of the closed-loop maximum."""

    value: float
    percent: bool


@dataclass(frozen=True)
class Options:
    """Everything that shapes a run; printed with the results."""

    url: str | None = None  # target this server instead of starting one
    store: str = "sqlite"
    synchronous: str = "full"
    #: PostgreSQL database the nodes share (``--store postgres``); None: the bench
    #: creates a throwaway database on the local cluster and drops it afterwards.
    postgres_url: str | None = None
    #: Where throwaway databases are created and dropped (a maintenance database).
    postgres_admin: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    #: The nodes' ``postgres_pool_mode`` and ``postgres_listen_url`` (a pooler in
    #: front of ``postgres_url``: docs/operations.md, "Behind a connection pooler").
    postgres_pool_mode: str = "session"
    postgres_listen_url: str | None = None
    nodes: tuple[int, ...] = (1,)  # node counts to run the workloads with (postgres only)
    #: The nodes as one ``troth serve --workers N`` on one port (not N servers).
    one_port: bool = False
    peers: tuple[str, ...] = ()  # queues measured on the same database server (postgres)
    peer_jobs: int = 20_000  # jobs of the batched peer run
    peer_batch: int = 100  # enqueue and dequeue batch of the batched peer run
    peer_producers: tuple[int, ...] = ()  # producer counts of the single-job run (--clients)
    peer_inflight: int = 4  # jobs a single-job producer may have not yet completed
    dir: str | None = None  # where the database (and the raw-SQLite probe) live
    keep: bool = False  # keep the working directory
    clients: int = 64
    warmup: float = 2.0
    duration: float = 10.0
    workers: int = 8  # SSE worker connections for lifecycle and fanout
    children: int = 8  # fanout width
    reads_ids: int = 10_000
    timers: int = 10_000
    timer_spread: float = 5.0
    hb_tasks: int = 1_000
    hb_workers: int = 10
    handoff_limits: tuple[int, ...] = (1, 8)  # handoff: the concurrency limits measured
    handoff_backlog: int = 64  # handoff: tasks held behind the limit throughout
    limit_seconds: float = 3.0
    workloads: tuple[str, ...] = WORKLOADS
    scale: tuple[int, ...] = ()  # stored-promise counts for the scale comparison
    scale_seconds: float = 5.0
    profile: str | None = None  # directory for py-spy profiles of the server
    profile_mode: str = "gil"  # gil: samples holding the GIL; active: every non-idle one
    json: str | None = None
    op_timeout: float = 30.0  # longest wait for one message before the run fails
    wait_quiet: float = 0.0  # seconds to wait, before each measurement, for other load to stop
    steps: int = 300  # sdk-steps: sequential ctx.run steps of the measured workflow
    sdks: tuple[str, ...] = SDKS  # sdk-steps: which SDKs
    sdk_stores: tuple[str, ...] = SDK_STORES  # sdk-steps: troth's stores to run them against
    wf_steps: int = 20  # sdk-workflows: sequential ctx.run steps per workflow
    wf_count: int = 200  # sdk-workflows: workflows of one batch phase
    wf_inflight: int = 16  # sdk-workflows: workflows in flight per SDK process
    sdk_processes: tuple[int, ...] = (1,)  # sdk-workflows: SDK worker processes (a sweep)
    wf_single: int = 10  # sdk-workflows: workflows run one at a time
    wf_stores: tuple[str, ...] = WF_STORES  # sdk-workflows: troth's stores
    rounds: int = 1  # sdk-workflows: visits of every target, alternating order
    resonate_sql: str | None = None  # --peers resonate-pg: path of resonate.sql
    #: The NATS the server of ``--url`` uses, for the NATS workloads; None: the bench
    #: starts a nats-server of its own (and gives its servers ``--nats-url``).
    nats_url: str | None = None
    #: Start the servers with ``--tracing``, exporting to a sink the bench runs
    #: (``bench/otlp_sink.py``): what tracing costs, against a run without it; the
    #: share of workflows sampled (1: all; 0: tracing off).
    tracing: float = 0.0
    open_loop: tuple[Offered, ...] = ()  # open-loop loads after each closed run (none: off)
    open_loop_cap: int = 512  # most connections (operations in flight) of the open loop
    arrivals: str = "uniform"  # open-loop arrival process: uniform or poisson
    chart: str | None = None  # SVG of the open-loop curves


def _names(what: str, choices: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """An argparse type for a comma-separated list of names from ``choices``."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(w.strip() for w in text.split(",") if w.strip())
        for w in names:
            if w not in choices:
                raise argparse.ArgumentTypeError(f"unknown {what} {w!r}; choose from {choices}")
        return names

    return parse


_workloads = _names("workload", WORKLOADS + NAMED_ONLY + NATS_WORKLOADS + FLOW_WORKLOADS)
_sdks = _names("SDK", SDKS)
_sdk_stores = _names("store", SDK_STORES)
_peers = _names("peer", PEERS)
_wf_stores = _names("store", WF_STORES)


def _nodes(text: str) -> tuple[int, ...]:
    """A list of counts >= 1 (``--nodes 1,2``, ``--peer-producers 64,8``)."""
    try:
        counts = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"want counts like 1,2, not {text!r}") from None
    if not counts or any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError("counts must be >= 1")
    return counts


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--scale wants counts like 1000000, not {text!r}"
        ) from None
    if any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError("--scale counts must be >= 1")
    return counts


def open_loop_loads(text: str) -> tuple[Offered, ...]:
    """``sweep``, or a list of percentages (``50%``) and rates (``2000``) in operations/s."""
    if text.strip() == "sweep":
        return tuple(Offered(v, True) for v in SWEEP)
    loads = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        percent = item.endswith("%")
        try:
            value = float(item.rstrip("%").replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--open-loop wants 'sweep' or loads like 50%,90%,2000, not {text!r}"
            ) from None
        if value <= 0:
            raise argparse.ArgumentTypeError("--open-loop loads must be > 0")
        loads.append(Offered(value, percent))
    if not loads:
        raise argparse.ArgumentTypeError("--open-loop needs at least one load")
    return tuple(loads)


def _ratio(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"a ratio in (0, 1], not {text}")
    return value


def add_bench_flags(p: argparse.ArgumentParser) -> None:
    d = Options()
    p.add_argument("--url", help="drive this running server instead of starting one")
    p.add_argument(
        "--store",
        choices=["sqlite", "memory", "postgres"],
        default=d.store,
        help="the store of the server it starts (%(default)s)",
    )
    p.add_argument(
        "--postgres-url",
        help="database the nodes share with --store postgres (default: a throwaway database"
        " created on postgresql://postgres@127.0.0.1:5432/postgres and dropped afterwards)",
    )
    p.add_argument(
        "--postgres-pool-mode",
        choices=["session", "transaction"],
        default=d.postgres_pool_mode,
        help="the nodes' postgres_pool_mode (a pooler in transaction mode at --postgres-url)",
    )
    p.add_argument("--postgres-listen-url", help="the nodes' postgres_listen_url (direct)")
    p.add_argument(
        "--postgres-admin-url",
        default=d.postgres_admin,
        help="maintenance database the throwaway databases are created from"
        f" (default {d.postgres_admin})",
    )
    p.add_argument(
        "--nodes",
        type=_nodes,
        default=d.nodes,
        help="troth processes on the one database (postgres); a list such as 1,2 runs the"
        " workloads once per count, each on a fresh database",
    )
    p.add_argument(
        "--one-port",
        action="store_true",
        help="run the nodes as one 'troth serve --workers N' (one port, the kernel spreads"
        " connections) instead of N servers the clients are spread over",
    )
    p.add_argument(
        "--peers",
        type=_peers,
        default=d.peers,
        help=f"also measure these peers on the same PostgreSQL server: {','.join(PEERS)}"
        " (pgqueuer needs: pip install -e './bench[pgqueuer]'; resonate-pg runs with"
        " --workloads sdk-workflows and needs --resonate-sql)",
    )
    p.add_argument(
        "--hold-horizon",
        type=float,
        metavar="SECONDS",
        help="with --store postgres: lifecycle in 20 s windows, 60 s as is, SECONDS while"
        " a snapshot holds PostgreSQL's horizon back, 30 s after; with --peers pgqueuer"
        " PgQueuer's queue the same way (python -m troth_bench.horizon for every knob)",
    )
    p.add_argument("--peer-jobs", type=int, default=d.peer_jobs, help="batched peer jobs (20000)")
    p.add_argument("--peer-batch", type=int, default=d.peer_batch, help="peer batch size (100)")
    p.add_argument(
        "--peer-producers",
        type=_nodes,
        default=d.peer_producers,
        help="producer counts of the single-job peer run, e.g. 64,8,1 (default: --clients)",
    )
    p.add_argument(
        "--peer-inflight",
        type=int,
        default=d.peer_inflight,
        help="jobs each single-job producer may have enqueued and not yet completed (4)",
    )
    p.add_argument(
        "--synchronous",
        choices=["full", "normal"],
        default=d.synchronous,
        help="SQLite durability of the server it starts (%(default)s)",
    )
    p.add_argument("--dir", help="working directory for the database (default: a new temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the working directory")
    p.add_argument("--clients", type=int, default=d.clients, help="concurrent clients (64)")
    p.add_argument("--warmup", type=float, default=d.warmup, help="seconds before measuring (2)")
    p.add_argument("--duration", type=float, default=d.duration, help="measured seconds (10)")
    p.add_argument("--workers", type=int, default=d.workers, help="SSE workers (8)")
    p.add_argument("--children", type=int, default=d.children, help="fanout width (8)")
    p.add_argument("--reads-ids", type=int, default=d.reads_ids, help="promises read (10000)")
    p.add_argument("--timers", type=int, default=d.timers, help="timer promises (10000)")
    p.add_argument("--timer-spread", type=float, default=d.timer_spread, help="seconds (5)")
    p.add_argument("--hb-tasks", type=int, default=d.hb_tasks, help="heartbeated tasks (1000)")
    p.add_argument("--hb-workers", type=int, default=d.hb_workers, help="heartbeat workers (10)")
    p.add_argument(
        "--limit-seconds", type=float, default=d.limit_seconds, help="per limit probe (3)"
    )
    p.add_argument(
        "--handoff-limits",
        type=_nodes,
        default=d.handoff_limits,
        help="handoff: the concurrency limits of its group, one measurement each"
        f" ({','.join(str(n) for n in d.handoff_limits)})",
    )
    p.add_argument(
        "--handoff-backlog",
        type=int,
        default=d.handoff_backlog,
        help=f"handoff: tasks held behind the limit throughout ({d.handoff_backlog})",
    )
    p.add_argument(
        "--workloads",
        type=_workloads,
        default=d.workloads,
        help=f"comma-separated subset of {','.join(WORKLOADS)} ('' for none: --scale only);"
        f" also {','.join(NAMED_ONLY)} (only when named: the published SDKs' step latency)"
        f", {','.join(NATS_WORKLOADS)} (only when named: requests and delivery over NATS,"
        " with a nats-server the bench starts) and handoff (only when named: a worker"
        " group under a concurrency limit, from a freed slot to the next execute)",
    )
    p.add_argument(
        "--nats-url",
        help="with --url: the NATS that server uses (its nats_url), for the NATS workloads"
        " (default: the bench starts its own nats-server and its servers use it)",
    )
    p.add_argument(
        "--steps", type=int, default=d.steps, help="sdk-steps: steps of the workflow (300)"
    )
    p.add_argument("--sdks", type=_sdks, default=d.sdks, help=f"sdk-steps: SDKs ({','.join(SDKS)})")
    p.add_argument(
        "--sdk-stores",
        type=_sdk_stores,
        default=d.sdk_stores,
        help=f"sdk-steps: troth stores to run the SDKs against ({','.join(SDK_STORES)})",
    )
    add_workflow_flags(p, d)
    p.add_argument(
        "--scale",
        type=_counts,
        default=d.scale,
        help="stored-promise counts to compare, e.g. 10000,1000000 (seeded before start)",
    )
    p.add_argument(
        "--scale-seconds",
        type=float,
        default=d.scale_seconds,
        help="measured seconds of each --scale count (%(default)g)",
    )
    p.add_argument("--profile", help="record py-spy profiles of the server into this directory")
    p.add_argument(
        "--profile-mode",
        choices=["gil", "active"],
        default=d.profile_mode,
        help="gil: only samples holding the GIL (where the server's one core of Python"
        " goes); active: every non-idle sample (includes time in fsync)",
    )
    p.add_argument(
        "--open-loop",
        type=open_loop_loads,
        default=d.open_loop,
        metavar="LOADS",
        help="after the closed run of create-settle and lifecycle, offer fixed arrival rates"
        " (no coordinated omission): 'sweep' = 25%%,50%%,75%%,90%%,100%% of the closed-loop"
        " maximum, or a list of percentages and operations/s such as 50%%,90%%,3000",
    )
    p.add_argument(
        "--open-loop-cap",
        type=int,
        default=d.open_loop_cap,
        help="most connections (operations in flight) of the open loop; operations due"
        " while all are busy are counted late, still timed from their intended start"
        f" ({d.open_loop_cap})",
    )
    p.add_argument(
        "--arrivals",
        choices=ARRIVALS,
        default=d.arrivals,
        help="open-loop arrivals: evenly spaced (uniform) or a Poisson process",
    )
    p.add_argument("--chart", help="write the open-loop curves to this SVG file")
    p.add_argument("--json", help="also write the results as JSON to this file")
    p.add_argument(
        "--op-timeout",
        type=float,
        default=d.op_timeout,
        help="longest wait for one message before the run fails (%(default)g s)",
    )
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=d.wait_quiet,
        help="on a shared machine: before each measurement, wait up to this many seconds"
        " until nothing else keeps a CPU busy (0: do not wait)",
    )
    p.add_argument(
        "--tracing",
        nargs="?",
        type=_ratio,
        const=1.0,
        default=d.tracing,
        metavar="RATIO",
        help="start the servers with --tracing, their spans exported over OTLP/HTTP to a"
        " sink the bench runs (needs troth[otel]); RATIO < 1 samples that share of"
        " workflows (OTEL_TRACES_SAMPLER=parentbased_traceidratio): run once with and"
        " once without it",
    )


def add_workflow_flags(p: argparse.ArgumentParser, d: Options) -> None:
    """The knobs of ``--workloads sdk-workflows`` (troth_bench.sdk_load)."""
    p.add_argument(
        "--workflow-steps",
        type=int,
        default=d.wf_steps,
        help=f"sdk-workflows: sequential ctx.run steps per workflow ({d.wf_steps})",
    )
    p.add_argument(
        "--workflows",
        type=int,
        default=d.wf_count,
        help=f"sdk-workflows: workflows of each batch phase ({d.wf_count})",
    )
    p.add_argument(
        "--workflows-inflight",
        type=int,
        default=d.wf_inflight,
        help=f"sdk-workflows: workflows in flight per SDK process ({d.wf_inflight})",
    )
    p.add_argument(
        "--sdk-processes",
        type=_nodes,
        default=d.sdk_processes,
        help="sdk-workflows: SDK worker processes; a list such as 1,2,4 runs a batch phase"
        " per count (1)",
    )
    p.add_argument(
        "--single-workflows",
        type=int,
        default=d.wf_single,
        help=f"sdk-workflows: workflows run one at a time ({d.wf_single})",
    )
    p.add_argument(
        "--workflow-stores",
        type=_wf_stores,
        default=d.wf_stores,
        help=f"sdk-workflows: troth stores to run against ({','.join(WF_STORES)})",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=d.rounds,
        help="sdk-workflows: visit every target this many times, alternating the order (1)",
    )
    p.add_argument(
        "--resonate-sql",
        help="--peers resonate-pg: the resonate.sql of the resonate-pg repository, applied"
        " to a throwaway database",
    )


def options_from(args: argparse.Namespace) -> Options:
    return Options(
        url=args.url,
        store=args.store,
        synchronous=args.synchronous,
        postgres_url=args.postgres_url,
        postgres_admin=args.postgres_admin_url,
        postgres_pool_mode=args.postgres_pool_mode,
        postgres_listen_url=args.postgres_listen_url,
        nodes=args.nodes,
        one_port=args.one_port,
        peers=args.peers,
        peer_jobs=args.peer_jobs,
        peer_batch=args.peer_batch,
        peer_producers=args.peer_producers,
        peer_inflight=args.peer_inflight,
        dir=args.dir,
        keep=args.keep,
        clients=args.clients,
        warmup=args.warmup,
        duration=args.duration,
        workers=args.workers,
        children=args.children,
        reads_ids=args.reads_ids,
        timers=args.timers,
        timer_spread=args.timer_spread,
        hb_tasks=args.hb_tasks,
        hb_workers=args.hb_workers,
        handoff_limits=args.handoff_limits,
        handoff_backlog=args.handoff_backlog,
        limit_seconds=args.limit_seconds,
        workloads=args.workloads,
        scale=args.scale,
        scale_seconds=args.scale_seconds,
        profile=args.profile,
        profile_mode=args.profile_mode,
        json=args.json,
        op_timeout=args.op_timeout,
        wait_quiet=args.wait_quiet,
        tracing=args.tracing,
        steps=args.steps,
        sdks=args.sdks,
        sdk_stores=args.sdk_stores,
        wf_steps=args.workflow_steps,
        wf_count=args.workflows,
        wf_inflight=args.workflows_inflight,
        sdk_processes=args.sdk_processes,
        wf_single=args.single_workflows,
        wf_stores=args.workflow_stores,
        rounds=args.rounds,
        resonate_sql=args.resonate_sql,
        nats_url=args.nats_url,
        open_loop=args.open_loop,
        open_loop_cap=args.open_loop_cap,
        arrivals=args.arrivals,
        chart=args.chart,
    )


def problems(opts: Options) -> list[str]:
    """Combinations of flags that cannot be honoured (the command exits 2 on them)."""
    out = []
    if opts.nodes != (1,) and opts.store != "postgres":
        out.append("--nodes needs --store postgres (only PostgreSQL is shared by processes)")
    if opts.postgres_url and opts.store != "postgres" and not opts.peers:
        out.append("--postgres-url is for --store postgres (or --peers)")
    if opts.url and (opts.nodes != (1,) or (opts.scale and opts.store == "postgres")):
        out.append("--url drives one running server: no --nodes, no postgres --scale")
    if opts.peer_batch < 1 or opts.peer_jobs < 1 or opts.peer_inflight < 1:
        out.append("--peer-batch, --peer-jobs and --peer-inflight must be >= 1")
    if "sdk-steps" in opts.workloads and (opts.url or opts.steps < 2):
        out.append("sdk-steps starts its own servers (no --url) and needs --steps >= 2")
    if "resonate-pg" in opts.peers and "sdk-workflows" not in opts.workloads:
        out.append("--peers resonate-pg runs with --workloads sdk-workflows: name it")
    if "sdk-workflows" in opts.workloads and (
        opts.url
        or min(opts.wf_steps, opts.wf_count, opts.wf_inflight, opts.rounds) < 1
        or opts.wf_single < 1
        or opts.wf_steps < 2
    ):
        out.append(
            "sdk-workflows starts its own servers (no --url) and needs --workflow-steps >= 2,"
            " --workflows, --workflows-inflight, --single-workflows and --rounds >= 1"
        )
    if opts.chart and not opts.open_loop:
        out.append("--chart draws the open-loop curves: it needs --open-loop")
    if opts.open_loop and not set(opts.workloads) & set(OPEN_LOOP):
        out.append(f"--open-loop runs with the workloads {','.join(OPEN_LOOP)}: name one")
    if opts.open_loop_cap < 1:
        out.append("--open-loop-cap must be >= 1")
    if "handoff" in opts.workloads and opts.handoff_backlog < 1:
        out.append("--handoff-backlog must be >= 1 (a freed slot needs a held task to hand off)")
    return out
