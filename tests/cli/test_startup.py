"""``troth serve`` says what happened at start: "listening" only once the port
accepts connections, and each way a start fails is one line on stderr with an exit
code of its own (README, "Exit codes of troth serve") — real processes on real sockets."""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from helpers.support import free_port
from troth.server.startup import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_LISTEN,
    EXIT_STORE,
)
from troth.store.sqlite import SqliteStore


def troth(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TROTH_")}
    return subprocess.run(
        [sys.executable, "-m", "troth.cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The start failed with exactly one line, and said nothing of listening."""
    assert "Traceback" not in done.stderr, done.stderr
    assert "listening on" not in done.stderr + done.stdout, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another process listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_port_in_use_is_one_line_exit_3_and_no_store_is_opened(
    tmp_path: Path, taken: int
) -> None:
    done = troth(tmp_path, "serve", "--port", str(taken), "--db", "t.db")
    assert done.returncode == EXIT_LISTEN == 3
    assert one_line(done) == f"troth: cannot listen on 127.0.0.1:{taken}: address already in use"
    assert not (tmp_path / "t.db").exists()  # bound first: nothing else was started


def test_workers_on_a_port_in_use_say_the_same(tmp_path: Path, taken: int) -> None:
    # The supervisor binds before any child or store: the URL is never dialled.
    args = ["--store", "postgres", "--postgres-url", "postgresql://127.0.0.1:1/none"]
    done = troth(tmp_path, "serve", "--port", str(taken), "--workers", "2", *args)
    assert done.returncode == EXIT_LISTEN
    assert one_line(done) == f"troth: cannot listen on 127.0.0.1:{taken}: address already in use"


def test_an_unknown_host_is_one_line_exit_3(tmp_path: Path) -> None:
    done = troth(tmp_path, "dev", "--host", "no-such-host.invalid", "--port", str(free_port()))
    assert done.returncode == EXIT_LISTEN
    # dev warns first that auth is off on a non-loopback host; the failure is the last line.
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("troth: cannot listen on no-such-host.invalid:")


def test_listening_is_said_once_the_port_accepts(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "troth.cli.main", "dev", "--port", str(port)],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while "troth listening on" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.01)
        # The moment the line is there, the server answers: no retry, no wait.
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        assert f"troth listening on http://127.0.0.1:{port} (store=memory" in log.read_text()
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://troth:s3cret-pw@127.0.0.1:1/none",  # nothing listens there
        "nonsense=1 password=s3cret-pw",  # not a connection string at all
    ],
)
def test_a_postgresql_store_that_cannot_be_opened_is_one_line_exit_4(
    tmp_path: Path, url: str
) -> None:
    args = ["--store", "postgres", "--postgres-url", url, "--port", str(free_port())]
    done = troth(tmp_path, "serve", *args)
    assert done.returncode == EXIT_STORE == 4
    line = one_line(done)
    assert line.startswith("troth: cannot open the PostgreSQL store (postgres_url): ")
    assert "s3cret-pw" not in done.stderr + done.stdout


def test_workers_on_a_database_that_does_not_answer_stop_at_once(tmp_path: Path) -> None:
    """Not children failing and starting again forever: one line, exit 4."""
    args = ["--store", "postgres", "--postgres-url", "postgresql://troth:s3cret-pw@127.0.0.1:1/x"]
    done = troth(tmp_path, "serve", "--workers", "2", "--port", str(free_port()), *args)
    assert done.returncode == EXIT_STORE
    assert one_line(done).startswith("troth: cannot open the PostgreSQL store (postgres_url): ")
    assert "s3cret-pw" not in done.stderr


def test_a_sqlite_file_that_cannot_be_created_is_one_line_exit_4(tmp_path: Path) -> None:
    db = tmp_path / "missing-dir" / "t.db"
    done = troth(tmp_path, "serve", "--db", str(db), "--port", str(free_port()))
    assert done.returncode == EXIT_STORE
    assert (
        one_line(done) == f"troth: cannot open the SQLite store {db}: unable to open database file"
    )


def test_a_database_of_a_newer_troth_is_one_line_exit_4(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    SqliteStore(str(db)).close()
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO schema_version VALUES (999, 'from the future', 0)")
    done = troth(tmp_path, "serve", "--db", str(db), "--port", str(free_port()))
    assert done.returncode == EXIT_STORE
    line = one_line(done)
    assert line.startswith(f"troth: cannot open the SQLite store {db}: database schema version")
    assert "newer than the latest this troth knows" in line


def test_an_unreadable_auth_key_is_one_line_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    done = troth(tmp_path, "serve", "--auth-publickey", str(missing), "--port", str(free_port()))
    assert done.returncode == EXIT_CONFIG == 2
    assert one_line(done).startswith(f"troth: auth_publickey: cannot read {missing}")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a key\n")
    done = troth(tmp_path, "serve", "--auth-publickey", str(garbage), "--port", str(free_port()))
    assert done.returncode == EXIT_CONFIG
    assert one_line(done).startswith("troth: auth_publickey")


def test_an_unreadable_certificate_is_one_line_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    args = ["--tls-cert", str(missing), "--tls-key", str(missing), "--port", str(free_port())]
    done = troth(tmp_path, "serve", *args)
    assert done.returncode == EXIT_CONFIG
    assert one_line(done) == f"troth: tls_cert: cannot read {missing}: No such file or directory"


def test_the_readme_documents_each_exit_code() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Exit codes of `troth serve`", 1)[1].split("\n## ", 1)[0]
    documented = {int(m) for m in re.findall(r"^\| `(\d+)` \|", section, re.M)}
    codes = {EXIT_FAILED, EXIT_CONFIG, EXIT_LISTEN, EXIT_STORE, EXIT_INTERRUPTED}
    assert codes <= documented, codes - documented
    assert "cannot listen on 127.0.0.1:8001: address already in use" in section
