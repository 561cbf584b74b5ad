"""The machine's own ceiling: nginx answering a fixed envelope, driven by ``wrk`` and by
the bench's own generator.

The bare uvicorn round trip (:mod:`troth_bench.bare`) is the ceiling of one Python
server stack, and troth's direct path for simple POSTs skips part of that stack, so
troth can pass it.  What no server on this machine passes is a C server that does
nothing: nginx (one worker process, as ``troth serve`` is one process) answering every
``POST`` with the same small JSON envelope.  Two figures:

* **wrk → nginx**: a C generator (one thread, the run's connection count) against it,
  what this machine's loopback and kernel do at all;
* **bench generator → nginx**: the bench's own Python generator against the same
  nginx, what this generator can measure at all — a troth figure near it is bound by
  the generator, not by troth.

nginx and wrk are system packages (``apt-get install nginx wrk``); without them this
is skipped, saying so.  nginx runs as a child of the bench (``daemon off``), with its
configuration, logs and temp files in a directory of the run's own, on a free port,
and is stopped with the run.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from troth_bench.bare import BODY
from troth_bench.client import Client
from troth_bench.http import HttpConnection
from troth_bench.limits import ENVELOPE
from troth_bench.measure import CpuShare, Probe, Recorder, Window, proc_cpu
from troth_bench.procs import child_pids, free_port
from troth_bench.results import Series

HOW_TO_GET = "nginx or wrk not found (apt-get install nginx wrk)"

CONFIG = """\
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            default_type application/json;
            return 200 '{body}';
        }}
    }}
}}
"""

#: wrk: every request a POST of the envelope troth's bare endpoint gets.
WRK_SCRIPT = """\
wrk.method = "POST"
wrk.body = '{body}'
wrk.headers["Content-Type"] = "application/json"
"""


def binaries() -> tuple[str, str] | None:
    nginx, wrk = shutil.which("nginx"), shutil.which("wrk")
    if nginx is None:  # Debian puts it in /usr/sbin, not always on a user's PATH
        nginx = next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
    return (nginx, wrk) if nginx and wrk else None


@dataclass
class Ceiling:
    """The machine ceiling's figures (None: not measured)."""

    wrk: Series | None = None
    generator: Series | None = None
    nginx_cpu: float | None = None  # nginx's cores while wrk drove it
    generator_cpu: CpuShare = field(default_factory=CpuShare)
    skipped: str | None = None


class Nginx:
    """nginx as a child process on a free port, configured in ``directory``."""

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary = binary
        self.dir = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        body = BODY.decode()
        (self.dir / "nginx.conf").write_text(CONFIG.format(dir=self.dir, port=self.port, body=body))
        log = open(self.dir / "stderr.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    "-p",
                    str(self.dir),
                    "-c",
                    str(self.dir / "nginx.conf"),
                    # Its start-up log too (before the configuration is read): a user
                    # who may not write the system's /var/log/nginx gets no alert.
                    "-e",
                    str(self.dir / "error.log"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited at start: {self.tail()}")
            try:
                with socket_to(self.port):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"nginx did not listen: {self.tail()}") from None
                time.sleep(0.05)

    @property
    def worker(self) -> int:
        """The worker process (the one that answers; the master only waits)."""
        assert self.proc is not None
        children = child_pids(self.proc.pid)
        return children[0] if children else self.proc.pid

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGQUIT)  # graceful: workers finish, then exit
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def tail(self) -> str:
        out = []
        for name in ("stderr.log", "error.log"):
            path = self.dir / name
            if path.exists():
                out += path.read_text(errors="replace").splitlines()[-10:]
        return "\n".join(out) or "(no log)"


def socket_to(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=1)


def parse_wrk(text: str, seconds: float) -> Series:
    """wrk's ``Requests/sec`` and its ``--latency`` percentiles as a Series."""
    total = re.search(r"(\d+) requests in ([\d.]+)(ms|s|m)\b", text)
    if total is None:
        raise RuntimeError(f"wrk printed no rate: {text[-500:]}")
    latency: dict[str, float] = {}
    for pct, value, unit in re.findall(r"^\s+(50|90|99)%\s+([\d.]+)(us|ms|s)\s*$", text, re.M):
        scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
        latency[f"p{pct}"] = float(value) * scale
    if errors := re.search(r"Non-2xx or 3xx responses: (\d+)", text):
        raise RuntimeError(f"nginx answered {errors[1]} requests with an error status")
    took = float(total[2]) * {"ms": 0.001, "s": 1.0, "m": 60.0}[total[3]]
    return Series("wrk → nginx", "req", int(total[1]), took or seconds, latency)


async def run_wrk(wrk: str, port: int, clients: int, seconds: float, directory: Path) -> Series:
    script = directory / "post.lua"
    script.write_text(WRK_SCRIPT.format(body=ENVELOPE.decode()))
    whole = max(1, round(seconds))
    proc = await asyncio.create_subprocess_exec(
        wrk,
        "-t1",
        f"-c{clients}",
        f"-d{whole}s",
        "--latency",
        "-s",
        str(script),
        f"http://127.0.0.1:{port}/",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), whole + 30)
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {out.decode()[-500:]}")
    return parse_wrk(out.decode(), whole)


async def drive(port: int, pid: int, clients: int, seconds: float) -> tuple[Series, CpuShare]:
    """The bench's generator (as for the bare round trip) against ``port``."""
    conns = [await Client.open("127.0.0.1", port, f"ceil{i}") for i in range(clients)]
    try:
        window = Window(min(1.0, seconds / 3), seconds)
        window.start()
        rec = Recorder(window)
        probe = Probe(window, pid)
        probe.start()

        async def loop(c: HttpConnection) -> None:
            while window.running:
                status, _ = await c.post(ENVELOPE)
                if status != 200:
                    raise RuntimeError(f"nginx answered {status}")
                rec.add("requests", c.read_at - c.sent_at, c.read_at)

        await asyncio.gather(*(loop(c.conn) for c in conns))
        await probe.finish()
        return Series.of("generator → nginx", "req", rec.series["requests"], seconds), probe.cpu
    finally:
        for c in conns:
            c.close()


async def machine_ceiling(workdir: Path, clients: int, seconds: float) -> Ceiling:
    """Both figures, or a Ceiling that says why it was skipped."""
    found = binaries()
    if found is None:
        return Ceiling(skipped=HOW_TO_GET)
    nginx_bin, wrk = found
    nginx = Nginx(nginx_bin, workdir / "nginx")
    ceiling = Ceiling()
    try:
        nginx.start()
        worker = nginx.worker
        before, t0 = proc_cpu(worker), time.perf_counter()
        ceiling.wrk = await run_wrk(wrk, nginx.port, clients, seconds, nginx.dir)
        after, t1 = proc_cpu(worker), time.perf_counter()
        if before is not None and after is not None:
            ceiling.nginx_cpu = (after - before) / (t1 - t0)
        ceiling.generator, ceiling.generator_cpu = await drive(nginx.port, worker, clients, seconds)
    finally:
        nginx.stop()
    return ceiling
