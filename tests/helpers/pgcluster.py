"""A throwaway PostgreSQL cluster of the test's own, on a free port.

Made with the system's ``pg_createcluster`` (postgresql-common: the Debian and
Ubuntu packages), which needs root; configured with what the test asks for (a
``conf.d`` file and its own ``pg_hba.conf``); stopped and dropped, data directory
and all, when the ``with`` block ends, failed or not.  Tests that need one skip,
saying how to get it, when the tools or root are missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.pgbouncer import free_port

VERSION = os.environ.get("TROTH_TEST_PG_VERSION", "15")
TOOLS = ("pg_createcluster", "pg_ctlcluster", "pg_dropcluster")

needs_pg_createcluster = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in TOOLS),
    reason=(
        "needs root and postgresql-common's pg_createcluster (apt-get install "
        f"postgresql-{VERSION}; run the tests as root, as scripts/test does in CI)"
    ),
)


@dataclass(frozen=True)
class PgCluster:
    name: str
    port: int
    conf: Path  # /etc/postgresql/{version}/{name}

    def url(self, db: str = "postgres", **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}" + (f"?{query}" if query else "")

    def log(self) -> str:
        path = Path(f"/var/log/postgresql/postgresql-{VERSION}-{self.name}.log")
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()[-2000:]}")


def give_to_postgres(path: Path, mode: int = 0o600) -> None:
    """A file the server reads (its key must be the server user's, mode 0600)."""
    shutil.chown(path, "postgres", "postgres")
    path.chmod(mode)


@contextmanager
def throwaway_cluster(
    settings: dict[str, str], hba: str, files: dict[str, Path] | None = None
) -> Iterator[PgCluster]:
    """A cluster with ``settings`` (postgresql.conf lines; ``{conf}`` in a value is
    its configuration directory) and ``hba`` (the whole pg_hba.conf), and ``files``
    copied into its configuration directory under the given names (the server's, mode
    0600), started; dropped afterwards."""
    name = f"troth_{uuid.uuid4().hex[:8]}"
    port = free_port()
    cluster = PgCluster(name, port, Path(f"/etc/postgresql/{VERSION}/{name}"))
    _run("pg_createcluster", VERSION, name, "-p", str(port))
    try:
        for target, source in (files or {}).items():
            shutil.copy(source, cluster.conf / target)
            give_to_postgres(cluster.conf / target)
        lines = ["listen_addresses = '127.0.0.1'"]
        lines += [f"{k} = {v.format(conf=cluster.conf)}" for k, v in settings.items()]
        (cluster.conf / "conf.d" / "troth-test.conf").write_text("\n".join(lines) + "\n")
        (cluster.conf / "pg_hba.conf").write_text(hba)
        try:
            _run("pg_ctlcluster", "--skip-systemctl-redirect", VERSION, name, "start")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{cluster.log()}") from None
        yield cluster
    finally:
        subprocess.run(
            ["pg_dropcluster", "--stop", VERSION, name], capture_output=True, timeout=120
        )


def ctl(cluster: PgCluster, action: str, *options: str) -> None:
    """``pg_ctlcluster`` on it: ``start``, ``stop`` (``-m immediate``: a crash),
    ``promote``, ``reload``."""
    try:
        _run("pg_ctlcluster", "--skip-systemctl-redirect", *options, VERSION, cluster.name, action)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\n{cluster.log()}") from None


@contextmanager
def standby_of(primary: PgCluster, settings: dict[str, str], hba: str) -> Iterator[PgCluster]:
    """A streaming standby of ``primary`` (``pg_basebackup -R``), started; named
    ``standby`` to its primary (``application_name`` of its replication
    connection); dropped afterwards."""
    name = f"troth_{uuid.uuid4().hex[:8]}"
    port = free_port()
    cluster = PgCluster(name, port, Path(f"/etc/postgresql/{VERSION}/{name}"))
    _run("pg_createcluster", VERSION, name, "-p", str(port))
    try:
        data = Path(f"/var/lib/postgresql/{VERSION}/{name}")
        for entry in data.iterdir():  # the directory stays: it is the server user's
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        source = f"host=127.0.0.1 port={primary.port} user=postgres application_name=standby"
        _run(
            *["runuser", "-u", "postgres", "--", "pg_basebackup"],
            *["-d", source, "-D", str(data), "-R", "-X", "stream", "-c", "fast"],
        )
        lines = ["listen_addresses = '127.0.0.1'"]
        lines += [f"{k} = {v}" for k, v in settings.items()]
        (cluster.conf / "conf.d" / "troth-test.conf").write_text("\n".join(lines) + "\n")
        (cluster.conf / "pg_hba.conf").write_text(hba)
        ctl(cluster, "start")
        yield cluster
    finally:
        subprocess.run(
            ["pg_dropcluster", "--stop", VERSION, name], capture_output=True, timeout=120
        )
