"""The open-loop bench: intended-time latency, the sweep's output, the SVG chart.

The scheduler test drives a real HTTP server on a socket that stops answering for a
while: an open loop must charge the stall to every request *scheduled* during it,
even those it could only send afterwards (coordinated omission would hide them).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from troth_bench import runner
from troth_bench.client import Client
from troth_bench.measure import Window
from troth_bench.openloop import OpenLoop
from troth_bench.options import Offered, Options, open_loop_loads, problems
from troth_bench.svg import Line, Panel, chart

SVG = "{http://www.w3.org/2000/svg}"
REPLY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class StallingServer:
    """Answers every POST at once, except between ``stall_from`` and ``stall_to``
    (``perf_counter`` seconds): a request read then is answered at ``stall_to``."""

    def __init__(self) -> None:
        self.stall_from = self.stall_to = 0.0
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                now = time.perf_counter()
                if self.stall_from <= now < self.stall_to:
                    await asyncio.sleep(self.stall_to - now)
                writer.write(REPLY)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def _stalled_run(cap: int) -> tuple[list[float], int, int, int]:
    server = StallingServer()
    port = await server.start()

    async def connect(k: int) -> Client:
        return await Client.open("127.0.0.1", port, f"t{k}")

    async def op(c: Client, n: int) -> tuple[float, float]:
        status, _ = await c.conn.post(b"{}")
        assert status == 200
        return c.conn.sent_at, c.conn.read_at

    loop = OpenLoop(connect, cap)
    window = Window(0.1, 1.0)
    try:
        # The stall: 0.2 s, starting 0.3 s into the window (set before the run starts,
        # relative to the instant the run will start the window).
        start = time.perf_counter()
        server.stall_from = start + 0.1 + 0.3
        server.stall_to = server.stall_from + 0.2
        run = await loop.run(200, window, op, drain=10)
    finally:
        loop.close()
        server.close()
    return run.latencies, run.late, run.scheduled, len(loop.pool)


def test_a_stall_is_charged_to_every_request_scheduled_during_it() -> None:
    latencies, late, scheduled, conns = asyncio.run(_stalled_run(cap=2))
    assert scheduled == 220  # 1.1 s at 200/s: the schedule did not slow down
    assert 199 <= len(latencies) <= 201  # every one intended in the window was measured
    # The ~20 requests due in the stall's first 0.1 s waited at least the rest of it,
    # though with 2 connections most of them could only be *sent* after it ended.
    assert sum(1 for x in latencies if x >= 0.1) >= 18
    assert max(latencies) >= 0.19
    assert late > 0 and conns == 2  # the cap held, and the late ones were counted


def test_without_a_cap_in_the_way_nothing_is_late() -> None:
    latencies, late, _, conns = asyncio.run(_stalled_run(cap=500))
    assert late == 0
    assert conns >= 20  # the pool grew to carry the requests the stall held
    assert sum(1 for x in latencies if x >= 0.1) >= 18


def test_loads_parse_sweep_percentages_and_rates() -> None:
    assert open_loop_loads("sweep") == tuple(Offered(v, True) for v in (25, 50, 75, 90, 100))
    assert open_loop_loads("50%, 2_000") == (Offered(50, True), Offered(2000, False))
    for bad in ("fast", "0", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            open_loop_loads(bad)
    assert problems(Options(chart="x.svg"))  # a chart needs --open-loop
    assert problems(Options(open_loop=(Offered(1, True),), workloads=("reads",)))


def test_the_chart_is_svg_with_one_line_per_percentile() -> None:
    lines = [
        Line(q, [(100.0, 1.0 * k), (200.0, 2.0 * k), (300.0, 40.0 * k)])
        for k, q in ((1, "p50"), (3, "p99"), (9, "p999"))
    ]
    text = chart(
        [Panel("create-settle <&>", "offered", lines, (280.0, "max")), Panel("b", "x", [])],
        "caption",
    )
    root = ET.fromstring(text.split("?>", 1)[1])
    assert root.tag == f"{SVG}svg"
    series = {p.get("data-series"): p for p in root.iter(f"{SVG}polyline") if p.get("data-series")}
    assert set(series) == {"p50", "p99", "p999"}
    for p in series.values():
        assert len(p.get("points", "").split()) == 3
    # Log scale: p999 (9x p50) sits above p50 at every x (smaller y).
    ys = {
        q: [float(pt.split(",")[1]) for pt in p.get("points", "").split()]
        for q, p in series.items()
    }
    assert all(a < b for a, b in zip(ys["p999"], ys["p50"], strict=True))
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "create-settle <&>" in texts and "caption" in texts


def test_the_sweep_prints_each_load_and_writes_the_chart(tmp_path: Path) -> None:
    chart_path = tmp_path / "curve.svg"
    opts = Options(
        dir=str(tmp_path),
        clients=4,
        warmup=0.2,
        duration=0.6,
        workers=2,
        limit_seconds=0.2,
        workloads=("create-settle", "lifecycle"),
        open_loop=(Offered(50, True), Offered(40, False)),
        chart=str(chart_path),
        op_timeout=20,
    )
    out = io.StringIO()
    report = runner.run(opts, out)
    text = out.getvalue()
    assert report.ok, text
    assert [c.workload for c in report.open_loop] == ["create-settle", "lifecycle"]
    for c in report.open_loop:
        assert f"-- open loop: {c.workload}" in text
        assert c.closed_max and c.closed_max > 0
        assert [p.label for p in c.points] == ["50%", "rate"]
        assert c.points[0].run.offered == pytest.approx(c.closed_max / 2)
        assert c.points[1].run.offered == 40
        for p in c.points:
            q = p.run.latency_ms()
            assert 0 < q["p50"] <= q["p99"] <= q["p999"] <= q["max"]
        assert any("read back resolved" in check for check in c.checks)
        assert all(p.run.jobs_per_commit for p in c.points)  # the server's counters were read
    assert "p999 ms" in text and "achieved" in text
    root = ET.fromstring(chart_path.read_text().split("?>", 1)[1])
    names = [p.get("data-series") for p in root.iter(f"{SVG}polyline") if p.get("data-series")]
    assert names == ["p50", "p99", "p999"] * 2
