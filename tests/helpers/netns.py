"""A network of the test's own, which it can cut: a namespace, a veth pair, a
PostgreSQL cluster listening on the pair's host side, and an iptables DROP.

* :func:`veth_namespace`: ``ip netns add`` a namespace and a veth pair with
  addresses; a process started in it (``ip netns exec``) reaches the host's side of
  the pair, and the host reaches it.
* :func:`throwaway_cluster`: a PostgreSQL cluster of its own (``initdb`` into a
  temporary directory, run as user ``postgres``) listening on 127.0.0.1 and on the
  veth's host-side address, trusting both; the machine's own cluster is untouched.
* :func:`cut`: ``iptables -j DROP`` of the database port inside the namespace, both
  ways — packets vanish, nothing answers, nothing is reset — until the block ends.

Everything is named after the test process (``trothcut<pid>``, links ``tcut<pid>h``
and ``tcut<pid>n``), and undone when the
block ends, even when the test failed; :func:`remove_leftovers` removes what a
crashed run (a pid no longer alive) left behind.  It all needs root (namespaces,
iptables, running PostgreSQL as ``postgres``): elsewhere the test is skipped with a
reason that says so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.support import free_port

PREFIX = "trothcut"
LINK = "tcut"
HOW = (
    "run the tests as root on Linux with iproute2, iptables and PostgreSQL's initdb/pg_ctl"
    " (apt-get install iproute2 iptables postgresql), as CI does"
)
#: Where the clusters live: ``{TMP}/trothcut<pid>-…``.
TMP = Path(tempfile.gettempdir())


def _run(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found is None:
        versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
        found = str(versions[-1]) if versions else None
    return found


def require() -> None:
    """Skip the test where the machine cannot give it what it needs."""
    missing = [n for n in ("ip", "iptables", "runuser") if shutil.which(n) is None]
    missing += [n for n in ("initdb", "pg_ctl") if _pg_bin(n) is None]
    if os.geteuid() != 0 or missing:
        why = "not root" if os.geteuid() != 0 else f"missing {', '.join(missing)}"
        pytest.skip(
            f"a network cut needs namespaces, iptables and a cluster of its own ({why}): {HOW}"
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers() -> list[str]:
    """Remove what a crashed run left (a namespace, a veth, a cluster named after a
    process that is gone); what was removed."""
    removed: list[str] = []
    pattern = re.compile(rf"^{PREFIX}(\d+)")
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if (m := pattern.match(name)) and not _alive(int(m[1])):
            _run("ip", "netns", "del", name, check=False)
            removed.append(f"namespace {name}")
    links = re.compile(rf"^{LINK}(\d+)[hn]$")
    for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        fields = line.split(":")
        name = fields[1].strip().split("@")[0] if len(fields) > 1 else ""
        if (m := links.match(name)) and not _alive(int(m[1])):
            _run("ip", "link", "del", name, check=False)
            removed.append(f"link {name}")
    pg_ctl = _pg_bin("pg_ctl")
    for where in TMP.glob(f"{PREFIX}*"):
        if (m := pattern.match(where.name)) and not _alive(int(m[1])):
            if pg_ctl is not None and (where / "data" / "postmaster.pid").exists():
                _run(
                    "runuser",
                    "-u",
                    "postgres",
                    "--",
                    pg_ctl,
                    "-D",
                    str(where / "data"),
                    "-m",
                    "immediate",
                    "stop",
                    check=False,
                )
            shutil.rmtree(where, ignore_errors=True)
            removed.append(f"cluster {where}")
    return removed


@dataclass(frozen=True)
class Namespace:
    name: str
    host_ip: str  # the host's side of the veth pair
    ns_ip: str  # the namespace's side

    def argv(self, *command: str) -> list[str]:
        """``command`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *command]


@contextmanager
def veth_namespace() -> Iterator[Namespace]:
    """A namespace with loopback up and a veth pair to the host (a /30 of its own)."""
    pid = os.getpid()
    # Interface names have at most 15 characters: the links' prefix is shorter.
    name, host_if, ns_if = f"{PREFIX}{pid}", f"{LINK}{pid}h", f"{LINK}{pid}n"
    used = _run("ip", "-o", "addr", "show", check=False).stdout
    octet = next(
        (o for o in [pid % 200 + 20, *range(20, 250)] if f" 10.213.{o}." not in used), None
    )
    if octet is None:
        pytest.skip("no free 10.213.x.0/30 for the test's veth pair")
    host_ip, ns_ip = f"10.213.{octet}.1", f"10.213.{octet}.2"
    try:
        _run("ip", "netns", "add", name)
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _run("ip", "link", "set", ns_if, "netns", name)
        _run("ip", "addr", "add", f"{host_ip}/30", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        inside = ["ip", "netns", "exec", name]
        _run(*inside, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        _run(*inside, "ip", "link", "set", ns_if, "up")
        _run(*inside, "ip", "link", "set", "lo", "up")
        yield Namespace(name, host_ip, ns_ip)
    finally:
        _run("ip", "netns", "del", name, check=False)  # its end of the pair, its rules
        _run("ip", "link", "del", host_if, check=False)


@dataclass(frozen=True)
class PgCluster:
    port: int
    directory: Path

    def url(self, host: str, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@{host}:{self.port}/{dbname}"


@contextmanager
def throwaway_cluster(listen: list[str], trust: list[str]) -> Iterator[PgCluster]:
    """A PostgreSQL cluster of its own on a free port, listening on ``listen`` and
    trusting connections from the ``trust`` networks (CIDR), stopped and deleted
    when the block ends."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    assert initdb is not None and pg_ctl is not None
    directory = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=TMP))
    data = directory / "data"
    shutil.chown(directory, "postgres", "postgres")
    port = free_port()
    as_postgres = ["runuser", "-u", "postgres", "--"]
    try:
        _run(
            *as_postgres,
            initdb,
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "-N",
            timeout=120,
        )
        with (data / "pg_hba.conf").open("a") as hba:
            for net in trust:
                hba.write(f"host all all {net} trust\n")
        options = (
            f"-c listen_addresses='{','.join(listen)}' -c port={port}"
            f" -c unix_socket_directories='{directory}' -c fsync=off"
            " -c synchronous_commit=off -c full_page_writes=off -c max_connections=100"
        )
        log = directory / "server.log"
        _run(
            *as_postgres,
            pg_ctl,
            "-D",
            str(data),
            "-l",
            str(log),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
            timeout=90,
        )
        yield PgCluster(port, directory)
    finally:
        if (data / "postmaster.pid").exists():
            _run(
                *as_postgres,
                pg_ctl,
                "-D",
                str(data),
                "-m",
                "immediate",
                "stop",
                check=False,
                timeout=60,
            )
        shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def cut(ns: Namespace, port: int) -> Iterator[None]:
    """Drop every packet to and from ``port`` inside ``ns`` for the block."""
    rules = [
        ["OUTPUT", "-p", "tcp", "--dport", str(port), "-j", "DROP"],
        ["INPUT", "-p", "tcp", "--sport", str(port), "-j", "DROP"],
    ]
    added: list[list[str]] = []
    try:
        for rule in rules:
            _run(*ns.argv("iptables", "-I", *rule))
            added.append(rule)
        yield
    finally:
        for rule in added:
            _run(*ns.argv("iptables", "-D", *rule), check=False)
