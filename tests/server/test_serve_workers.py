"""``troth serve --workers N`` on PostgreSQL: N nodes on one port, one service
(server/workers.py).  A real supervisor process, real children, a real database."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
import pytest

from helpers import pg, support
from helpers.support import VERSION, free_port


def child_pids(pid: int) -> list[int]:
    """The child processes of ``pid``, sorted (Linux: /proc/PID/task/PID/children);
    none when it is gone."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return sorted(int(c) for c in text.split())


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with pg.throwaway_database("troth_workers") as url:
        yield url


#: Processes start and stop here, and a check may open a connection: a minute unless a
#: call says otherwise, polled every 0.1 s.
wait_for = functools.partial(support.wait_for, timeout=60.0, every=0.1)


@contextmanager
def serve(tmp_path: Path, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """``troth serve ARGS`` on a free port, its output in a log; killed if the test
    left it running."""
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "troth.cli.main", "serve", "--port", str(port), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    try:
        yield proc, port, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def accepted(pid: int, port: int) -> int:
    """Established connections to ``port`` that process ``pid`` holds (Linux /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    held = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].rsplit(":", 1)[1], 16)
        if local_port == port and fields[3] == "01" and fields[9] in inodes:
            held += 1
    return held


def ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def nodes(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT node FROM nodes")}


def create(port: int, id: str) -> int:
    head = {"corrId": id, "version": VERSION}
    far = int(time.time() * 1000) + 3_600_000
    data = {"id": id, "timeoutAt": far, "param": {}, "tags": {}}
    # A new connection each time: the kernel spreads them over the children.
    r = httpx.post(
        f"http://127.0.0.1:{port}/",
        json={"kind": "promise.create", "head": head, "data": data},
        headers={"connection": "close"},
        timeout=10,
    )
    return int(r.json()["head"]["status"])


def test_workers_share_one_port_restart_the_dead_and_stop_together(
    pg_url: str, tmp_path: Path
) -> None:
    pg.fresh_store(pg_url).close()
    with serve(tmp_path, "--store", "postgres", "--postgres-url", pg_url, "--workers", "3") as (
        proc,
        port,
        log,
    ):
        wait_for("the service to answer", lambda: ready(port))
        wait_for("three children", lambda: len(child_pids(proc.pid)) == 3)
        wait_for("three nodes", lambda: len(nodes(pg_url)) == 3)
        first = child_pids(proc.pid)
        for i in range(30):
            assert create(port, f"w{i}") in (200, 201)

        # Kept-alive connections opened at once are spread over every child (each
        # child listens on the port itself: SO_REUSEPORT), not taken by the first.
        conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(48)]
        try:
            for c in conns:
                c.sendall(b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n")
                assert c.recv(4096).startswith(b"HTTP/1.1 200")
            spread = [accepted(pid, port) for pid in first]
            assert sum(spread) == 48 and min(spread) >= 4, spread
        finally:
            for c in conns:
                c.close()

        # A child killed outright is started again; the service answers throughout.
        victim = first[0]
        os.kill(victim, signal.SIGKILL)
        wait_for(
            "the dead child to be replaced",
            lambda: len(child_pids(proc.pid)) == 3 and victim not in child_pids(proc.pid),
        )
        for i in range(30, 60):
            assert create(port, f"w{i}") in (200, 201)
        # The new child is a new node; the dead one's row goes when its heartbeat
        # is missed (node_timeout), as for a dead node on another machine.
        wait_for("three live nodes again", lambda: len(nodes(pg_url)) == 3, timeout=90)
        text = log.read_text()
        assert "exited with signal SIGKILL" in text, text[-2000:]

        # SIGTERM to the supervisor stops every child gracefully, and it exits 0.
        alive = child_pids(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-2000:]
        for pid in alive:
            wait_for(f"child {pid} to exit", lambda pid=pid: not Path(f"/proc/{pid}").exists())
        assert nodes(pg_url) == set(), "a child left without leaving the cluster"
        with psycopg.connect(pg_url) as conn:
            stored = conn.execute("SELECT count(*) FROM promises").fetchone()
        assert stored is not None and stored[0] == 60


def test_children_stop_when_the_supervisor_is_killed(pg_url: str, tmp_path: Path) -> None:
    """No orphan node keeps serving the port with nobody watching it."""
    pg.fresh_store(pg_url).close()
    with serve(tmp_path, "--store", "postgres", "--postgres-url", pg_url, "--workers", "2") as (
        proc,
        port,
        _,
    ):
        wait_for("the service to answer", lambda: ready(port))
        wait_for("two children", lambda: len(child_pids(proc.pid)) == 2)
        kids = child_pids(proc.pid)
        proc.kill()
        proc.wait()
        for pid in kids:
            wait_for(f"child {pid} to exit", lambda pid=pid: not _running(pid))
        assert not ready(port)


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie is reaped by init, eventually)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("store", ["sqlite", "memory"])
def test_workers_need_postgres(store: str, tmp_path: Path) -> None:
    with serve(tmp_path, "--store", store, "--workers", "2") as (proc, _, log):
        assert proc.wait(30) == 2
        assert "workers > 1 needs store postgres" in log.read_text()
