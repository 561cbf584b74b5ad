"""A real PgBouncer in front of the tests' PostgreSQL, on a free port.

The system package's ``/usr/sbin/pgbouncer`` (``apt-get install pgbouncer``; the
tests that need it skip, saying so, when it is absent), configured in a throwaway
directory: every database of the upstream server, ``auth_type = trust`` with a
userlist of the one user the tests connect as, the pool mode the test asks for.
A test may kill it and start it again on the same port (:meth:`Bouncer.kill`,
:meth:`Bouncer.restart`).  Stopped and its directory removed when the ``with``
block ends, failed or not.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from helpers.pg import ADMIN_URL

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
MISSING = f"needs PgBouncer at {PGBOUNCER}: apt-get install pgbouncer (scripts/test does)"
#: Seconds PgBouncer has to accept connections after it starts.
START_TIMEOUT = 10.0

needs_pgbouncer = pytest.mark.skipif(not os.access(PGBOUNCER, os.X_OK), reason=MISSING)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Daemon:
    """The pgbouncer process of a :class:`Bouncer`: started, killed, started again
    with the same configuration (so on the same port)."""

    def __init__(self, argv: list[str], home: Path, probe: str) -> None:
        self.argv, self.home, self.probe = argv, home, probe
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with (self.home / "pgbouncer.log").open("ab") as log:
            self.proc = proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with psycopg.connect(self.probe, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"pgbouncer did not start: {(self.home / 'pgbouncer.log').read_text()[-2000:]}"
                    ) from None
                time.sleep(0.05)

    def stop(self, *, kill: bool = False) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if kill:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@dataclass(frozen=True)
class Bouncer:
    port: int
    pool_mode: str
    daemon: _Daemon | None = field(default=None, compare=False, repr=False)

    def url(self, direct: str) -> str:
        """``direct`` (a database on the upstream server) reached through this pooler."""
        params = conninfo_to_dict(direct)
        params.update(host="127.0.0.1", port=str(self.port))
        return make_conninfo("", **params)

    def kill(self) -> None:
        """SIGKILL the pooler: its clients' connections are cut, new ones refused."""
        assert self.daemon is not None
        self.daemon.stop(kill=True)

    def restart(self) -> None:
        """Start the pooler again, on the same port; returns once it answers."""
        assert self.daemon is not None
        self.daemon.start()


@contextmanager
def pgbouncer(
    pool_mode: str = "transaction", *, pool_size: int = 20, upstream_url: str = ADMIN_URL
) -> Iterator[Bouncer]:
    """PgBouncer in ``pool_mode`` on a free port, in front of the server of
    ``upstream_url`` (the tests' own by default), for the ``with`` block."""
    upstream = conninfo_to_dict(upstream_url)
    user = str(upstream.get("user") or "postgres")
    port = free_port()
    home = Path(tempfile.mkdtemp(prefix="troth-pgbouncer-"))
    home.chmod(0o755)  # PgBouncer refuses to run as root: it drops to ``user`` then
    (home / "userlist.txt").write_text(f'"{user}" ""\n')
    (home / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={upstream.get('host') or '127.0.0.1'} port={upstream.get('port') or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {home / 'userlist.txt'}\n"
        f"pool_mode = {pool_mode}\ndefault_pool_size = {pool_size}\n"
        "max_client_conn = 500\nserver_check_delay = 0\n"
    )
    for f in home.iterdir():
        f.chmod(0o644)
    argv = [PGBOUNCER, *(["-u", user] if os.geteuid() == 0 else []), str(home / "pgbouncer.ini")]
    bouncer = Bouncer(port, pool_mode)
    daemon = _Daemon(argv, home, bouncer.url(upstream_url))
    try:
        daemon.start()
        yield Bouncer(port, pool_mode, daemon)
    finally:
        daemon.stop()
        shutil.rmtree(home, ignore_errors=True)
