"""TLS to PostgreSQL (docs/operations.md, "TLS to PostgreSQL").

A cluster of the test's own with ``ssl = on`` and a certificate the test makes
(valid for 127.0.0.1), which accepts TLS connections only (``hostssl`` in
pg_hba.conf).  troth with ``sslmode=verify-full`` and that certificate as its CA
serves, and every connection it opens is encrypted; with another CA it refuses to
start, with one line and exit status 4 (the store cannot be opened: README, "Exit
codes of troth serve").
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from helpers.pgbouncer import free_port
from helpers.pgcluster import (
    PgCluster,
    needs_pg_createcluster,
    throwaway_cluster,
)
from helpers.support import running_server
from helpers.tls import Cert, self_signed
from troth.server.config import Settings

pytestmark = needs_pg_createcluster

HBA = "local all postgres peer\nhostssl all all 127.0.0.1/32 trust\n"


@pytest.fixture(scope="module")
def server_cert(tmp_path_factory: pytest.TempPathFactory) -> Cert:
    return self_signed(tmp_path_factory.mktemp("pg-tls"), "server")


@pytest.fixture(scope="module")
def tls_cluster(server_cert: Cert) -> Iterator[PgCluster]:
    settings = {
        "ssl": "on",
        "ssl_cert_file": "'{conf}/troth-test-cert.pem'",
        "ssl_key_file": "'{conf}/troth-test-key.pem'",
    }
    files = {"troth-test-cert.pem": server_cert.cert, "troth-test-key.pem": server_cert.key}
    with throwaway_cluster(settings, HBA, files) as cluster:
        yield cluster


def test_verify_full_with_the_right_ca_serves_and_encrypts_every_connection(
    tls_cluster: PgCluster, server_cert: Cert
) -> None:
    url = tls_cluster.url(sslmode="verify-full", sslrootcert=str(server_cert.cert))
    with running_server(Settings(store="postgres", postgres_url=url, node_id="tls")) as node:
        node.ok("promise.create", {"id": "p", "timeoutAt": 10**13})
        assert node.ok("promise.get", {"id": "p"})["promise"]["id"] == "p"
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT a.application_name, s.ssl FROM pg_stat_activity a "
                "JOIN pg_stat_ssl s USING (pid) WHERE a.application_name LIKE 'troth%'"
            ).fetchall()
    names = {str(r[0]).split(":")[0] for r in rows}
    assert {"troth", "troth-read", "troth-cluster", "troth-listen"} <= names, rows
    assert all(r[1] for r in rows), rows


def test_a_wrong_ca_is_refused_at_startup_with_one_line(
    tls_cluster: PgCluster, tmp_path: Path
) -> None:
    other = self_signed(tmp_path, "other-ca")
    url = tls_cluster.url(sslmode="verify-full", sslrootcert=str(other.cert))
    argv = [sys.executable, "-m", "troth.cli.main", "serve", "--store", "postgres"]
    argv += ["--port", str(free_port()), "--postgres-url", url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 4, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("troth: cannot open the PostgreSQL store (postgres_url):"), lines
    assert "certificate verify failed" in lines[0], lines


def test_without_tls_the_cluster_refuses_the_connection(tls_cluster: PgCluster) -> None:
    """The cluster really asks for TLS: the test above is not passing on plain text."""
    with pytest.raises(psycopg.OperationalError, match=r"no pg_hba\.conf entry"):
        psycopg.connect(tls_cluster.url(sslmode="disable"), connect_timeout=5).close()
