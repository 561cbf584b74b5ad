"""A whole HTTP request's server work, in instructions (steady on a drifting machine).

``python -m troth_bench.instructions [--requests 400,1600] [--clients 16]`` runs a
``troth serve`` (SQLite file) and the bare-HTTP server (``bench/bare.py``) each under
``valgrind --tool=callgrind``, twice: once answering the smaller number of requests,
once the larger.  The difference of the two totals divided by the difference of the
requests is the server's instructions per request, start-up and shutdown cancelled
out; the same for the bare server gives the ceiling's.  Requests are
``promise.create`` then ``promise.settle`` (the create-settle workload; with
``--workload reads``, ``promise.get`` of a settled promise, a point read) from
``--clients`` keep-alive connections at once, so the writer batches as under load.

Why: on a shared two-CPU VM, requests/s and CPU seconds move by tens of percent with
the neighbours, far more than a change to the request path.  Instructions do not
move with them (caches and the GIL's hand-offs aside: valgrind runs one thread at a
time, so batches differ from a native run, and the figure is a measure of work, not
of time).  docs/performance-notes.md, "Measuring a change".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from troth_bench.http import HttpConnection
from troth_bench.procs import clean_env, free_port

FAR = 2**42


def envelope(kind: str, corr: str, data: Mapping[str, object]) -> bytes:
    head = {"corrId": corr, "version": "2026-04-01"}
    return json.dumps({"kind": kind, "head": head, "data": data}).encode()


WORKLOADS = ("create-settle", "reads")


async def drive(
    port: int, requests: int, clients: int, bare: bool, run: str, workload: str = "create-settle"
) -> None:
    """``requests`` POSTs over ``clients`` connections: create then settle, or
    ``promise.get`` of the promises the warm-up run (``run`` = "warm") created and
    settled, or empty POSTs for the bare server."""
    conns = [await HttpConnection.open("127.0.0.1", port) for _ in range(clients)]
    each = requests // clients

    async def client(i: int, conn: HttpConnection) -> None:
        for n in range(each // 2):
            id = f"{run}-{i}-{n}"
            if bare:
                await conn.post(b"{}")
                await conn.post(b"{}")
                continue
            if workload == "reads" and run != "warm":
                for _ in range(2):
                    read = f"warm-{i}-0"
                    status, _ = await conn.post(envelope("promise.get", id, {"id": read}))
                    assert status == 200, status
                continue
            create = {"id": id, "timeoutAt": FAR, "param": {}, "tags": {}}
            status, _ = await conn.post(envelope("promise.create", id, create))
            assert status == 200, status
            settle = {"id": id, "state": "resolved", "value": {}}
            status, _ = await conn.post(envelope("promise.settle", id, settle))
            assert status == 200, status

    try:
        await asyncio.gather(*(client(i, c) for i, c in enumerate(conns)))
    finally:
        for c in conns:
            c.close()


async def ready(port: int, bare: bool, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError("the server exited at start")
        try:
            conn = await HttpConnection.open("127.0.0.1", port)
            try:
                status, _ = await (conn.post(b"{}") if bare else conn.get("/ready"))
            finally:
                conn.close()
            if status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the server did not become ready under valgrind")
        await asyncio.sleep(0.5)


def control(pid: int, instrumentation: str) -> None:
    """Turn callgrind's instrumentation on or off in the running server."""
    subprocess.run(
        ["callgrind_control", "-i", instrumentation, str(pid)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def measure(
    workdir: Path, requests: int, clients: int, bare: bool, workload: str = "create-settle"
) -> dict[int, int]:
    """Instructions of one server process that answered ``requests`` requests."""
    port = free_port()
    out = workdir / f"callgrind.{'bare' if bare else 'troth'}.{requests}"
    if bare:
        server = [sys.executable, "-m", "troth_bench.bare", str(port)]
    else:
        db = workdir / f"troth-{requests}.db"
        server = [
            sys.executable,
            "-m",
            "troth.cli.main",
            "serve",
            "--port",
            str(port),
            "--db",
            str(db),
            "--log-level",
            "warning",
            "--no-ui",
        ]
    argv = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",  # start-up uncounted: on only while the requests run
        "--separate-threads=yes",
        f"--callgrind-out-file={out}",
        *server,
    ]
    log = open(workdir / f"{out.name}.log", "wb")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(argv, env=clean_env(), stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        asyncio.run(ready(port, bare, proc, 300))
        asyncio.run(drive(port, clients * 2, clients, bare, "warm"))  # first-use paths
        control(proc.pid, "on")
        asyncio.run(drive(port, requests, clients, bare, f"r{requests}", workload))
        control(proc.pid, "off")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return per_thread(out)


def per_thread(out: Path) -> dict[int, int]:
    """Instructions by thread (``--separate-threads``: a file per thread, ``out-NN``;
    thread 1 is the event loop's, the writer is the next one troth starts)."""
    totals: dict[int, int] = {}
    for path in sorted(out.parent.glob(f"{out.name}-*")):
        found = re.search(r"^totals: (\d+)", path.read_text(), re.MULTILINE)
        if found is None:
            raise RuntimeError(f"no total in {path}")
        totals[int(path.name.rsplit("-", 1)[1])] = int(found.group(1))
    if not totals:
        raise RuntimeError(f"no callgrind output at {out}-*")
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m troth_bench.instructions")
    parser.add_argument("--requests", default="400,1600", help="two request counts")
    parser.add_argument("--clients", type=int, default=16, help="connections at once (16)")
    parser.add_argument("--keep", help="keep the callgrind files in this directory")
    parser.add_argument(
        "--workload", choices=WORKLOADS, default="create-settle", help="troth's requests"
    )
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind not found: apt-get install valgrind", file=sys.stderr)
        return 2
    small, large = (int(n) for n in args.requests.split(","))
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="troth-instr-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for name, bare in (("bare HTTP (empty POST)", True), (f"troth {args.workload}", False)):
            small_run, large_run = (
                measure(workdir, n, args.clients, bare, args.workload) for n in (small, large)
            )
            threads = sorted(set(small_run) | set(large_run))
            each = {
                t: (large_run.get(t, 0) - small_run.get(t, 0)) / (large - small) for t in threads
            }
            per = sum(each.values())
            rows.append((name, per))
            loop = each.get(1, 0.0)
            print(
                f"{name:28} {per:12,.0f} instructions per request "
                f"(event loop {loop:,.0f}, other threads {per - loop:,.0f})",
                flush=True,
            )
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    ratio = rows[0][1] / rows[1][1]
    print(f"{'ratio (bare / troth)':28} {ratio:12.3f}  (python {sys.version.split()[0]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
