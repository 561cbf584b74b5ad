"""Tables: the settings in force, the limits, one section per workload, the summary,
the scale comparison and the targets of issue 5, all as plain text."""

from __future__ import annotations

from collections.abc import Sequence

from troth.bench.measure import CpuShare
from troth.bench.results import Limits, Result, ScalePoint, Series

MB = 1024 * 1024

#: Workloads whose every request writes (ratios to the SQLite ceilings make sense).
WRITES = {"create-settle", "lifecycle", "fanout", "heartbeat"}


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


def limits_lines(limits: Limits, synchronous: str) -> list[str]:
    q = limits.sqlite_commit_latency
    http = limits.http
    rows = [
        [
            "raw SQLite, 1 row per durable commit",
            "",
            f"{limits.sqlite_commits:,.0f} commits/s" if limits.sqlite_commits else "-",
            ms(q.get("p50")),
            ms(q.get("p90")),
            ms(q.get("p99")),
            ms(q.get("max")),
        ],
        [
            "raw SQLite, 100 rows per commit",
            "",
            f"{limits.sqlite_rows:,.0f} rows/s" if limits.sqlite_rows else "-",
            "",
            "",
            "",
            "",
        ],
    ]
    if http is not None:
        h = http.latency
        rows.append(
            [
                "bare HTTP round trip (empty POST)",
                "",
                rate(http),
                ms(h.get("p50")),
                ms(h.get("p90")),
                ms(h.get("p99")),
                ms(h.get("max")),
            ]
        )
    lines = [f"limits (same machine and file system, synchronous={synchronous.upper()})"]
    lines += table(["ceiling", "", "rate", "p50 ms", "p90 ms", "p99 ms", "max ms"], rows)
    if http is not None:
        c = limits.http_cpu
        cost = 1e6 * c.generator / http.rate if http.rate else 0.0
        lines.append(
            f"  bare server CPU {cores(c.server)} · generator {cores(c.generator)}"
            f" → generator cost {cost:.1f} µs CPU per request"
        )
        lines.extend(noise(c))
    return lines


def noise(c: CpuShare) -> list[str]:
    """A warning when something else kept the machine busy during the window."""
    other = c.elsewhere
    if other is None or other < 0.15:
        return []
    return [f"  WARNING: other load on the machine: {other:.2f} cores busy outside the bench"]


def cores(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} cores"


def headline_rate(r: Result) -> float | None:
    if r.name == "heartbeat":
        s = r.line("task.heartbeat")
    elif r.name == "reads":
        s = r.line("promise.get")
    else:
        s = r.line("requests")
    return None if s is None else s.rate


def result_lines(r: Result, limits: Limits) -> list[str]:
    title = f"{r.name} ({r.context})" if r.context else r.name
    lines = [f"-- {title} " + "-" * max(0, 60 - len(title))]
    lines += table(
        ["line", "done", "rate", "p50 ms", "p90 ms", "p99 ms", "max ms"], series_rows(r.series)
    )
    c = r.cpu
    cpu = f"  server CPU {cores(c.server)}"
    if c.server is not None:
        cpu += f" (event loop {c.server_loop:.2f}, writer and others {c.server_other:.2f})"
    cpu += f" · generator {cores(c.generator)}"
    if c.generator >= 0.9:
        cpu += " (SATURATED: figures bound the generator)"
    cpu += f" · server RSS max {mb(r.rss_max)}"
    lines.append(cpu)
    lines.extend(noise(c))
    if r.commits_per_s is not None:
        lines.append(
            f"  group commit: {r.commits_per_s:,.0f} request transactions/s,"
            f" {r.jobs_per_commit:.1f} requests per transaction"
        )
    req = headline_rate(r)
    http = limits.http.rate if limits.http else None
    parts = [f"{ratio(req, http)} bare HTTP"]
    if r.name in WRITES:
        parts.append(f"{ratio(req, limits.sqlite_commits)} 1-row SQLite commits")
        parts.append(f"{ratio(req, limits.sqlite_rows)} 100-row SQLite rows")
    if req is not None:
        lines.append("  requests/s vs limits: " + " · ".join(parts))
    for check in r.checks:
        lines.append(f"  verified: {check}")
    for note in r.notes:
        lines.append(f"  note: {note}")
    return lines


def summary_lines(results: Sequence[Result], limits: Limits) -> list[str]:
    rows = []
    http = limits.http.rate if limits.http else None
    for r in results:
        for s in r.series:
            if s.name in ("promise.create", "promise.settle") or s.name.startswith("leases"):
                continue
            q = s.latency
            is_head = s.rate is not None and s.rate == headline_rate(r)
            rows.append(
                [
                    r.name,
                    s.name,
                    rate(s),
                    ms(q.get("p50")),
                    ms(q.get("p99")),
                    ms(q.get("max")),
                    ratio(s.rate, http) if is_head else "",
                    ratio(s.rate, limits.sqlite_commits) if is_head and r.name in WRITES else "",
                    ratio(s.rate, limits.sqlite_rows) if is_head and r.name in WRITES else "",
                    cores(r.cpu.server).replace(" cores", "") if s is r.series[0] else "",
                    f"{r.cpu.generator:.2f}" if s is r.series[0] else "",
                    cores(r.cpu.elsewhere).replace(" cores", "") if s is r.series[0] else "",
                ]
            )
    head = ["workload", "line", "rate", "p50 ms", "p99 ms", "max ms", "xHTTP", "x1-row", "x100-row"]
    head += ["srv CPU", "gen CPU", "other"]
    return [
        "summary (CPU in cores over the window; other = busy outside the bench: noise)",
        *table(head, rows),
    ]


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
    where = f"{cpus} CPUs, synchronous={synchronous.upper()}, {clients} clients"
    title = f"targets of issue 5 (stated for 2 cores, FULL, 64 clients; this run: {where})"
    return [title, *table(["target", "this run", ""], rows)]
