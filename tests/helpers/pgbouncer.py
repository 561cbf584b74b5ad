"""A real PgBouncer in front of the tests' PostgreSQL, on a free port.

The system package's ``/usr/sbin/pgbouncer`` (``apt-get install pgbouncer``; the
tests that need it skip, saying so, when it is absent), configured in a throwaway
directory: every database of the upstream server, ``auth_type = trust`` with a
userlist of the one user the tests connect as, the pool mode the test asks for.
Stopped and its directory removed when the ``with`` block ends, failed or not.
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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Bouncer:
    port: int
    pool_mode: str

    def url(self, direct: str) -> str:
        """``direct`` (a database on the upstream server) reached through this pooler."""
        params = conninfo_to_dict(direct)
        params.update(host="127.0.0.1", port=str(self.port))
        return make_conninfo("", **params)


@contextmanager
def pgbouncer(pool_mode: str = "transaction", *, pool_size: int = 20) -> Iterator[Bouncer]:
    """PgBouncer in ``pool_mode`` on a free port, for the ``with`` block."""
    upstream = conninfo_to_dict(ADMIN_URL)
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
    log = (home / "pgbouncer.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        bouncer = Bouncer(port, pool_mode)
        probe = bouncer.url(ADMIN_URL)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with psycopg.connect(probe, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"pgbouncer did not start: {(home / 'pgbouncer.log').read_text()[-2000:]}"
                    ) from None
                time.sleep(0.05)
        yield bouncer
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
        shutil.rmtree(home, ignore_errors=True)
