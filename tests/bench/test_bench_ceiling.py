"""The bench's machine ceiling: a real nginx (started and stopped by the bench) driven
by a real ``wrk`` and by the bench's own generator, run tiny."""

from __future__ import annotations

import asyncio
import io
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from troth_bench import ceiling, runner
from troth_bench.options import Options

WRK_OUTPUT = """\
Running 1s test @ http://127.0.0.1:40000/
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   150.00us   40.00us   2.00ms   90.00%
    Req/Sec    50.00k     1.00k   52.00k    70.00%
  Latency Distribution
     50%  140.00us
     75%  160.00us
     90%  190.00us
     99%    1.20ms
  50123 requests in 1.00s, 9.00MB read
Requests/sec:  50100.00
Transfer/sec:      9.00MB
"""


def test_wrk_output_is_read_as_a_series() -> None:
    s = ceiling.parse_wrk(WRK_OUTPUT, 1.0)
    assert s.count == 50123 and s.rate == pytest.approx(50123.0)
    assert s.latency == {"p50": pytest.approx(0.14), "p90": pytest.approx(0.19), "p99": 1.2}
    with pytest.raises(RuntimeError, match="error status"):
        ceiling.parse_wrk(WRK_OUTPUT + "  Non-2xx or 3xx responses: 12\n", 1.0)
    with pytest.raises(RuntimeError, match="no rate"):
        ceiling.parse_wrk("connection refused", 1.0)


needs_binaries = pytest.mark.skipif(
    ceiling.binaries() is None, reason="needs nginx and wrk: apt-get install nginx wrk"
)


@needs_binaries
def test_nginx_answers_both_drivers_and_is_stopped_after(tmp_path: Path) -> None:
    got = asyncio.run(ceiling.machine_ceiling(tmp_path, 4, 0.5))
    assert got.skipped is None
    assert got.wrk is not None and (got.wrk.rate or 0) > 100
    assert got.generator is not None and (got.generator.rate or 0) > 100
    assert got.generator.latency["p50"] > 0 and got.nginx_cpu is not None
    port = int(
        (tmp_path / "nginx" / "nginx.conf").read_text().split("listen 127.0.0.1:")[1].split(";")[0]
    )
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass  # nobody listens any more: nginx was stopped with its workers


def test_without_nginx_the_ceiling_is_skipped_saying_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ceiling, "binaries", lambda: None)
    got = asyncio.run(ceiling.machine_ceiling(tmp_path, 4, 0.5))
    assert got.wrk is None and got.skipped == ceiling.HOW_TO_GET


@needs_binaries
def test_the_run_prints_the_ceiling_and_troth_against_it(tmp_path: Path) -> None:
    out = io.StringIO()
    opts = Options(
        dir=str(tmp_path),
        workloads=("create-settle",),
        clients=4,
        warmup=0.2,
        duration=0.5,
        limit_seconds=0.5,
    )
    report = runner.run(replace(opts), out)
    text = out.getvalue()
    assert report.ok, text
    assert "machine ceiling (nginx" in text and "wrk → nginx" in text
    assert "nginx (same generator)" in text
    assert report.to_json()["limits"]["nginx_generator"]["count"] > 0
