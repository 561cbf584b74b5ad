"""Tables: the settings in force, the limits, one section per workload, the summary,
the scale comparison, the peers, and troth's targets on SQLite and on PostgreSQL,
all as plain text."""

from __future__ import annotations

from collections.abc import Sequence

from troth.plural import counted
from troth_bench.measure import CpuShare
from troth_bench.results import Limits, Result, ScalePoint, Series

MB = 1024 * 1024

#: Workloads whose every request writes (ratios to the SQLite ceilings make sense).
WRITES = {
    "create-settle",
    "lifecycle",
    "fanout",
    "heartbeat",
    "create-settle-nats",
    "lifecycle-nats",
    "handoff",
    "lifecycle-beside-limit",
}


def ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:,.0f}"


def rate(s: Series | None) -> str:
    if s is None or s.rate is None:
        return "-"
    return f"{s.rate:,.0f} {s.unit}/s"


def mb(v: int | None) -> str:
    return "-" if v is None else f"{v / MB:,.1f} MB"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "-"
    return f"{a / b:.3g}x"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Left-aligned first column(s), right-aligned figures."""
    widths = [max(len(str(r[k])) for r in [header, *rows]) for k in range(len(header))]
    out = []
    for r in [header, *rows]:
        cells = [
            f"{c:<{w}}" if k < 2 else f"{c:>{w}}"
            for k, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        out.append(indent + "  ".join(cells).rstrip())
    return out


def series_rows(series: Sequence[Series]) -> list[list[str]]:
    rows = []
    for s in series:
        q = s.latency
        rows.append(
            [
                s.name,
                f"{s.count:,}",
                rate(s),
                ms(q.get("p50")),
                ms(q.get("p90")),
                ms(q.get("p99")),
                ms(q.get("max")),
            ]
        )
    return rows


QUANTILES = ("p50", "p90", "p99", "max")


def _ceiling(label: str, value: float | None, unit: str, q: dict[str, float] | None) -> list[str]:
    """One row of the limits table: a rate and, when measured, its latencies."""
    latencies = ["", "", "", ""] if q is None else [ms(q.get(k)) for k in QUANTILES]
    return [label, "", f"{value:,.0f} {unit}" if value else "-", *latencies]


def limits_lines(limits: Limits, synchronous: str) -> list[str]:
    http = limits.http
    if limits.pg_method:
        n = limits.pg_clients
        rows = [
            _ceiling(
                f"raw PostgreSQL, 1 row per commit, {counted(n, 'connection')}",
                limits.pg_commits,
                "commits/s",
                limits.pg_commit_latency,
            ),
            _ceiling(
                "raw PostgreSQL, 1 row per commit, 1 connection",
                limits.pg_serial,
                "commits/s",
                limits.pg_serial_latency,
            ),
            _ceiling(
                "raw PostgreSQL, 100 rows per commit, 1 connection", limits.pg_rows, "rows/s", None
            ),
        ]
        title = (
            "limits (same machine, same PostgreSQL server, a throwaway database;"
            f" {limits.pg_method}, promise-sized rows)"
        )
    else:
        rows = [
            _ceiling(
                "raw SQLite, 1 row per durable commit",
                limits.sqlite_commits,
                "commits/s",
                limits.sqlite_commit_latency,
            ),
            _ceiling("raw SQLite, 100 rows per commit", limits.sqlite_rows, "rows/s", None),
        ]
        title = f"limits (same machine and file system, synchronous={synchronous.upper()})"
    if http is not None:
        h = http.latency
        rows.append(
            [
                "bare HTTP round trip (empty POST)",
                "",
                rate(http),
                *(ms(h.get(k)) for k in QUANTILES),
            ]
        )
    lines = [title]
    lines += table(["ceiling", "", "rate", "p50 ms", "p90 ms", "p99 ms", "max ms"], rows)
    if http is not None:
        c = limits.http_cpu
        cost = 1e6 * c.generator / http.rate if http.rate else 0.0
        lines.append(
            f"  bare server CPU {cores(c.server)} · generator {cores(c.generator)}"
            f" → generator cost {cost:.1f} µs CPU per request"
        )
        lines.extend(noise(c))
    lines.extend(ceiling_lines(limits))
    return lines


def ceiling_lines(limits: Limits) -> list[str]:
    """The machine ceiling (nginx, a fixed envelope) and how close the bare round trip
    comes to it."""
    if limits.nginx_skipped:
        return [f"  machine ceiling not measured: {limits.nginx_skipped}"]
    rows = []
    for s in (limits.nginx_wrk, limits.nginx_generator):
        if s is not None:
            q = s.latency
            rows.append([s.name, rate(s), *(ms(q.get(k)) for k in ("p50", "p90", "p99"))])
    if not rows:
        return []
    out = ["machine ceiling (nginx, 1 worker, a fixed envelope; same connections)"]
    out += table(["driver", "rate", "p50 ms", "p90 ms", "p99 ms"], rows)
    gen = limits.nginx_generator.rate if limits.nginx_generator else None
    wrk = limits.nginx_wrk.rate if limits.nginx_wrk else None
    http = limits.http.rate if limits.http else None
    out.append(
        f"  nginx CPU under wrk {cores(limits.nginx_cpu)} · generator against nginx"
        f" {cores(limits.nginx_generator_cpu)} · generator ÷ wrk {ratio(gen, wrk)}"
        f" · bare uvicorn ÷ generator→nginx {ratio(http, gen)}"
    )
    return out


def store_words(limits: Limits) -> tuple[str, str]:
    """How the one-row and 100-row ceilings are called in the ratio lines."""
    if limits.pg_method:
        return "1-row PostgreSQL commits", "100-row PostgreSQL rows"
    return "1-row SQLite commits", "100-row SQLite rows"


def noise(c: CpuShare) -> list[str]:
    """A warning when something else kept the machine busy during the window."""
    other = c.elsewhere
    if other is None or other < 0.15:
        return []
    return [f"  WARNING: other load on the machine: {other:.2f} cores busy outside the bench"]


def cores(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} cores"


def headline_line(r: Result) -> Series | None:
    """The line troth's figures are compared with the limits on: requests (or the
    one request kind a workload sends), or a peer's headline."""
    if r.peer:
        return r.line(r.headline)
    if r.name == "heartbeat":
        return r.line("task.heartbeat")
    if r.name == "reads":
        return r.line("promise.get")
    return r.line("requests")


def headline_rate(r: Result) -> float | None:
    s = headline_line(r)
    return None if s is None else s.rate


def cpu_line(r: Result) -> str:
    c = r.cpu
    if r.peer:
        cpu = f"  consumer CPU {cores(c.server)} (its own process)"
    elif r.nodes > 1:
        cpu = f"  server CPU {cores(c.server)} summed over {r.nodes} nodes"
        if c.server is not None:
            cpu += f" (event loops {c.server_loop:.2f}, writers and others {c.server_other:.2f})"
    else:
        cpu = f"  server CPU {cores(c.server)}"
        if c.server is not None:
            cpu += f" (event loop {c.server_loop:.2f}, writer and others {c.server_other:.2f})"
    if c.database is not None:
        cpu += f" · PostgreSQL {cores(c.database)}"
    cpu += f" · {'producers' if r.peer else 'generator'} {cores(c.generator)}"
    if c.generator >= 0.9:
        cpu += " (SATURATED: figures bound the generator)"
    if r.rss_max is not None or not r.peer:
        cpu += f" · {'consumer' if r.peer else 'server'} RSS max {mb(r.rss_max)}"
    return cpu


def result_lines(r: Result, limits: Limits) -> list[str]:
    title = f"{r.name} ({r.context})" if r.context else r.name
    lines = [f"-- {title} " + "-" * max(0, 60 - len(title))]
    lines += table(
        ["line", "done", "rate", "p50 ms", "p90 ms", "p99 ms", "max ms"], series_rows(r.series)
    )
    lines.append(cpu_line(r))
    lines.extend(noise(r.cpu))
    if r.commits_per_s is not None:
        lines.append(
            f"  group commit: {r.commits_per_s:,.0f} request transactions/s,"
            f" {r.jobs_per_commit:.1f} requests per transaction"
            + (f" (all {r.nodes} nodes)" if r.nodes > 1 else "")
        )
    req = headline_rate(r)
    http = limits.http.rate if limits.http else None
    one, hundred = store_words(limits)
    parts = [] if r.peer else [f"{ratio(req, http)} bare HTTP"]
    if not r.peer and limits.nginx_generator is not None:
        parts.append(f"{ratio(req, limits.nginx_generator.rate)} nginx (same generator)")
    if r.name in WRITES or r.peer:
        parts.append(f"{ratio(req, limits.one_row)} {one}")
        parts.append(f"{ratio(req, limits.batched_rows)} {hundred}")
    if req is not None and parts:
        what = "jobs/s" if r.peer else "requests/s"
        lines.append(f"  {what} vs limits: " + " · ".join(parts))
    for check in r.checks:
        lines.append(f"  verified: {check}")
    for note in r.notes:
        lines.append(f"  note: {note}")
    return lines


def summary_lines(results: Sequence[Result], limits: Limits) -> list[str]:
    rows = []
    http = limits.http.rate if limits.http else None
    nginx = limits.nginx_generator.rate if limits.nginx_generator else None
    with_db = any(r.cpu.database is not None for r in results)
    for r in results:
        for s in r.series:
            if s.name in ("promise.create", "promise.settle") or s.name.startswith("leases"):
                continue
            q = s.latency
            is_head = s.rate is not None and s is headline_line(r)
            writes = is_head and (r.name in WRITES or bool(r.peer))
            first = s is r.series[0]
            row = [
                f"{r.name} ({r.context})" if r.context else r.name,
                s.name,
                rate(s),
                ms(q.get("p50")),
                ms(q.get("p99")),
                ms(q.get("max")),
                ratio(s.rate, http) if is_head and not r.peer else "",
                ratio(s.rate, nginx) if is_head and not r.peer else "",
                ratio(s.rate, limits.one_row) if writes else "",
                ratio(s.rate, limits.batched_rows) if writes else "",
                cores(r.cpu.server).replace(" cores", "") if first else "",
            ]
            if with_db:
                db = r.cpu.database
                row.append(f"{db:.2f}" if first and db is not None else "")
            row += [
                f"{r.cpu.generator:.2f}" if first else "",
                cores(r.cpu.elsewhere).replace(" cores", "") if first else "",
            ]
            rows.append(row)
    head = ["workload", "line", "rate", "p50 ms", "p99 ms", "max ms", "xHTTP", "xnginx"]
    head += ["x1-row", "x100-row"]
    head += ["srv CPU", *(["pg CPU"] if with_db else []), "gen CPU", "other"]
    note = "summary (CPU in cores over the window; other = busy outside the bench: noise"
    if with_db:
        note += "; pg = PostgreSQL's processes for the run; a peer's srv = its consumer"
    return [note + ")", *table(head, rows)]


def scale_lines(points: Sequence[ScalePoint]) -> list[str]:
    rows = []
    for p in points:
        by = {r.name: r for r in p.results}
        cs = by.get("create-settle")
        rd = by.get("reads")
        lc = by.get("lifecycle")
        cs_line = cs.line("requests") if cs else None
        rd_line = rd.line("promise.get") if rd else None
        lc_line = lc.line("tasks") if lc else None
        rows.append(
            [
                f"{p.stored:,}",
                f"{p.db_bytes / MB:,.0f} MB",
                mb(p.rss_at_rest),
                rate(cs_line),
                ms(cs_line.latency.get("p99") if cs_line else None),
                rate(rd_line),
                ms(rd_line.latency.get("p50") if rd_line else None),
                ms(rd_line.latency.get("p99") if rd_line else None),
                rate(lc_line),
                mb(lc.rss_max if lc else None),
                mb(p.rss_after),
                f"{max((r.cpu.elsewhere or 0.0) for r in p.results):.2f}" if p.results else "-",
            ]
        )
    head = ["stored", "db file", "RSS rest", "create-settle", "p99 ms", "promise.get"]
    head += ["p50 ms", "p99 ms", "lifecycle", "RSS lifecycle", "RSS after", "other"]
    lines = ["scale (a fresh server on a database seeded with settled promises)"]
    lines += table(head, rows)
    lines.append("  promise.get reads ids drawn at random over all the stored promises;")
    lines.append("  other = most cores busy outside the bench during any of its windows (noise)")
    return lines


def target_lines(
    results: Sequence[Result],
    points: Sequence[ScalePoint],
    cpus: int,
    synchronous: str,
    clients: int,
) -> list[str]:
    by = {r.name: r for r in results}
    rows: list[list[str]] = []

    def add(target: str, value: str, met: bool | None) -> None:
        rows.append([target, value, "-" if met is None else "met" if met else "NOT MET"])

    cs = by.get("create-settle")
    if cs is not None and (s := cs.line("requests")) is not None and s.rate is not None:
        p99 = s.latency.get("p99", float("inf"))
        add(
            "create-settle >= 5,000 req/s, p99 <= 25 ms",
            f"{s.rate:,.0f} req/s, p99 {ms(p99)} ms",
            s.rate >= 5000 and p99 <= 25,
        )
    lc = by.get("lifecycle")
    if lc is not None and (s := lc.line("tasks")) is not None and s.rate is not None:
        add("lifecycle >= 1,000 tasks/s", f"{s.rate:,.0f} tasks/s", s.rate >= 1000)
    if lc is not None and (d := lc.line("dispatch")) is not None and d.latency:
        add("dispatch latency p50 <= 5 ms", f"p50 {ms(d.latency['p50'])} ms", d.latency["p50"] <= 5)
    rows.extend(flow_rows(results))
    tm = by.get("timers")
    if tm is not None and (g := tm.line("lag")) is not None and g.latency:
        add("timer lag p99 <= 20 ms", f"p99 {ms(g.latency['p99'])} ms", g.latency["p99"] <= 20)
    big = [p for p in points if p.stored >= 1_000_000]
    if big:
        worst = max(
            (
                v
                for p in big
                for v in (p.rss_at_rest, p.rss_after, *(r.rss_max for r in p.results))
                if v
            ),
            default=None,
        )
        add(
            "RSS <= 300 MB with 1M promises stored",
            f"max {mb(worst)}",
            None if worst is None else worst <= 300 * MB,
        )
    else:
        add("RSS <= 300 MB with 1M promises stored", "not measured (--scale 1000000)", None)
    where = (
        f"{counted(cpus, 'CPU')}, synchronous={synchronous.upper()}, {counted(clients, 'client')}"
    )
    title = f"troth's targets (stated for 2 cores, FULL, 64 clients; this run: {where})"
    return [title, *table(["target", "this run", ""], rows)]


def flow_rows(results: Sequence[Result]) -> list[list[str]]:
    """Flow control's targets: a freed slot's next ``execute`` within 5 ms (p50), timed
    from the fulfil's write (its own commit included: the figure errs long), and
    lifecycle beside a limit against lifecycle in the same run (no target: a ratio)."""
    rows: list[list[str]] = []
    for r in results:
        if r.name == "handoff" and (h := r.line("handoff")) is not None and h.latency:
            p50 = h.latency["p50"]
            after = r.line("after answer")
            answered = f" ({ms(after.latency.get('p50'))} after the answer)" if after else ""
            rows.append(
                [
                    f"handoff ({r.context}): fulfil written → next execute p50 <= 5 ms",
                    f"p50 {ms(p50)} ms{answered}, p99 {ms(h.latency['p99'])} ms",
                    "met" if p50 <= 5 else "NOT MET",
                ]
            )
    for r in results:
        if r.name != "lifecycle-beside-limit":
            continue
        plain = next(
            (p for p in results if p.name == "lifecycle" and p.nodes == r.nodes),
            None,
        )
        mine, theirs = r.line("tasks"), plain.line("tasks") if plain else None
        if mine is None or mine.rate is None:
            continue
        if theirs is None or not theirs.rate:
            value = f"{mine.rate:,.0f} tasks/s (lifecycle not run: --workloads lifecycle,handoff)"
        else:
            value = (
                f"{mine.rate:,.0f} vs {theirs.rate:,.0f} tasks/s ({ratio(mine.rate, theirs.rate)})"
            )
        where = f" ({r.context})" if r.context else ""
        rows.append([f"lifecycle beside a limit ÷ lifecycle{where}", value, "-"])
    return rows


def postgres_target_lines(
    results: Sequence[Result], peers: Sequence[Result], limits: Limits
) -> list[str]:
    """troth's targets on PostgreSQL: its lifecycle on one node at least
    PgQueuer's single-job end-to-end rate, and two nodes faster than one."""

    def rate_of(name: str, nodes: int, line: str) -> float | None:
        for r in results:
            if r.name == name and r.nodes == nodes and (s := r.line(line)) is not None:
                return s.rate
        return None

    rows: list[list[str]] = []

    def add(target: str, value: str, met: bool | None) -> None:
        rows.append([target, value, "-" if met is None else "met" if met else "NOT MET"])

    one = rate_of("lifecycle", 1, "tasks")
    two = rate_of("lifecycle", 2, "tasks")
    singles = [
        (s.rate, r.context)
        for r in peers
        if r.name == "pgqueuer single" and (s := r.line("jobs")) is not None and s.rate
    ]
    best = max(singles, default=None)
    if one is not None and best is not None:
        add(
            "lifecycle on 1 node >= PgQueuer single-job rate",
            f"{one:,.0f} tasks/s vs {best[0]:,.0f} jobs/s ({best[1]}, best measured)",
            one >= best[0],
        )
    else:
        add(
            "lifecycle on 1 node >= PgQueuer single-job rate",
            "not measured (--store postgres --nodes 1 --peers pgqueuer)",
            None,
        )
    if one is not None and two is not None:
        add("lifecycle: 2 nodes faster than 1", f"{two:,.0f} vs {one:,.0f} tasks/s", two > one)
    else:
        add("lifecycle: 2 nodes faster than 1", "not measured (--nodes 1,2)", None)
    rows.extend(flow_rows(results))
    cs1 = rate_of("create-settle", 1, "requests")
    cs2 = rate_of("create-settle", 2, "requests")
    if cs1 is not None and cs2 is not None:
        add("create-settle: 2 nodes faster than 1", f"{cs2:,.0f} vs {cs1:,.0f} req/s", cs2 > cs1)
    title = "troth's PostgreSQL targets"
    if limits.pg_commits:
        title += f" (raw 1-row commits in this run: {limits.pg_commits:,.0f}/s)"
    return [title, *table(["target", "this run", ""], rows)]
