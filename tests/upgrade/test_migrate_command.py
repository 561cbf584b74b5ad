"""``troth migrate check|plan|apply`` on SQLite and PostgreSQL, and ``serve``'s
refusals at start: a newer or unknown schema, or a migration due while another
node's heartbeat is alive — one line and exit status 4, never a traceback."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from helpers import pg
from helpers.support import free_port
from troth.server.config import Settings
from troth.server.run import prepare_schema
from troth.store.postgres.migrate import PACKAGE as PG
from troth.store.postgres.migrate import PgSchema
from troth.store.sql.migrate import load_migrations
from troth.store.sqlite import SqliteStore
from troth.store.sqlite.migrate import PACKAGE as LITE
from troth.store.upgrade import open_schema

LATEST = len(load_migrations(LITE))
EXIT_SCHEMA = 4


def troth(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "troth.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def versions(db: Path) -> list[tuple[int, str]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT version, name FROM schema_version ORDER BY version").fetchall()
    finally:
        conn.close()


def test_sqlite_check_plan_apply(tmp_path: Path) -> None:
    db = tmp_path / "troth.db"
    check = troth("migrate", "check", "--store", "sqlite", "--db", str(db))
    assert check.returncode == 1, check
    assert f"schema version 0 of {LATEST}" in check.stdout
    assert not db.exists()  # looking creates nothing
    plan = troth("migrate", "plan", "--store", "sqlite", "--db", str(db), "--sql")
    assert plan.returncode == 0, plan
    for m in load_migrations(LITE):
        assert f"troth/store/sqlite/migrations/{m.version:03d}_{m.name}.sql" in plan.stdout
    assert "CREATE TABLE promises" in plan.stdout  # --sql shows the statements
    assert not db.exists()
    apply = troth("migrate", "apply", "--store", "sqlite", "--db", str(db))
    assert apply.returncode == 0, apply
    assert [v for v, _ in versions(db)] == list(range(1, LATEST + 1))
    assert f"applied {LATEST:03d}_{load_migrations(LITE)[-1].name}" in apply.stdout
    again = troth("migrate", "check", "--store", "sqlite", "--db", str(db))
    assert again.returncode == 0 and "up to date" in again.stdout, again
    assert troth("migrate", "apply", "--store", "sqlite", "--db", str(db)).returncode == 0


def test_version_6_repairs_origins_an_older_writer_left_out(tmp_path: Path) -> None:
    """Rows written without origin (by a troth older than version 3, after a newer
    one migrated) are found again once version 6 runs."""
    db = tmp_path / "troth.db"
    SqliteStore(db).close()
    conn = sqlite3.connect(db, isolation_level=None)
    # Back to version 5, as such a file was: later versions' rows and columns gone.
    conn.execute("DELETE FROM schema_version WHERE version >= 6")
    conn.execute("ALTER TABLE promises DROP COLUMN trace")
    for table in ("flow_limits", "flow_slots", "flow_held"):
        conn.execute(f"DROP TABLE {table}")
    conn.execute(
        "INSERT INTO promises (id, state, param, value, tags, timeout_at, created_at, "
        "callbacks, listeners, external, undrained) VALUES ('c', 'pending', '{}', '{}', "
        """'{"resonate:origin":"r"}', 10, 0, '[]', '[]', 0, 0)"""
    )
    conn.close()
    check = troth("migrate", "check", "--db", str(db))
    assert check.returncode == 1 and "006_rolling_upgrades" in check.stdout, check
    assert troth("migrate", "apply", "--db", str(db)).returncode == 0
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT origin FROM promises WHERE id = 'c'").fetchall() == [("r",)]
    conn.close()


@pytest.fixture
def newer(tmp_path: Path) -> Path:
    db = tmp_path / "troth.db"
    SqliteStore(db).close()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("INSERT INTO schema_version VALUES (99, 'from_the_future', 0)")
    conn.close()
    return db


@pytest.fixture
def unknown(tmp_path: Path) -> Path:
    db = tmp_path / "troth.db"
    SqliteStore(db).close()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("UPDATE schema_version SET name = 'another_build' WHERE version = 4")
    conn.close()
    return db


@pytest.mark.parametrize("kind", ["newer", "unknown"])
def test_serve_and_migrate_refuse_a_schema_they_do_not_know(
    kind: str, request: pytest.FixtureRequest
) -> None:
    db: Path = request.getfixturevalue(kind)
    before = versions(db)
    words = "is newer than" if kind == "newer" else "'another_build', which this troth does not"
    port = str(free_port())
    for args in (["serve", "--port", port], ["migrate", "check"], ["migrate", "apply"]):
        done = troth(*args, "--store", "sqlite", "--db", str(db))
        assert done.returncode == EXIT_SCHEMA, (args, done)
        assert words in one_line(done.stderr), done.stderr
    assert versions(db) == before


def test_a_memory_store_has_nothing_to_migrate(tmp_path: Path) -> None:
    config = tmp_path / "troth.toml"
    config.write_text('store = "memory"\n', encoding="utf-8")
    done = troth("migrate", "check", "--config", str(config))
    assert done.returncode == 2 and "no schema" in one_line(done.stderr)


# -- PostgreSQL ---------------------------------------------------------------------


@pytest.fixture
def at_5(pg_url: str) -> Iterator[str]:
    """The module's database, emptied, then built to schema version 5 (the previous
    release's) by its own migrations."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    with psycopg.connect(pg_url) as conn:
        schema = PgSchema(conn)
        schema.begin_exclusive()
        for migration in load_migrations(PG)[:5]:
            schema.apply(migration, 0)
        schema.commit()
    yield pg_url


def heartbeat(url: str, node: str, ago_ms: int) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO nodes (node, url, started_at, seen_at) VALUES "
            "(%s, 'http://old', 0, extract(epoch FROM clock_timestamp()) * 1000 - %s)",
            (node, ago_ms),
        )


@contextmanager
def beating(url: str, node: str) -> Iterator[None]:
    """``node`` heartbeats every half second while the block runs, as a live node
    does (a command started on a busy machine can take longer than ``node_timeout``
    after one beat)."""
    stop = threading.Event()

    def beat() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                conn.execute(
                    "UPDATE nodes SET seen_at = extract(epoch FROM clock_timestamp()) * 1000 "
                    "WHERE node = %s",
                    (node,),
                )
                if stop.wait(0.5):
                    return

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def stored(url: str) -> int:
    with psycopg.connect(url) as conn:
        return PgSchema(conn).stored_version()


def settings(url: str, node_id: str = "") -> Settings:
    return Settings(store="postgres", postgres_url=url, node_id=node_id, node_timeout=5.0)


def test_serve_migrates_alone_but_not_under_a_live_node(
    at_5: str, capsys: pytest.CaptureFixture[str]
) -> None:
    heartbeat(at_5, "old-live", 0)
    assert prepare_schema(settings(at_5)) == EXIT_SCHEMA
    line = one_line(capsys.readouterr().err)
    assert "old-live (http://old, release older, schema <= 5)" in line
    assert "troth migrate apply" in line
    assert stored(at_5) == 5
    # The same node restarting (its own row still fresh) is not another node.
    assert prepare_schema(settings(at_5, node_id="old-live")) is None
    assert stored(at_5) == len(load_migrations(PG))


def test_serve_migrates_past_a_dead_node(at_5: str) -> None:
    heartbeat(at_5, "old-dead", 60_000)  # silent for a minute: dead at node_timeout 5 s
    assert prepare_schema(settings(at_5)) is None
    assert stored(at_5) == len(load_migrations(PG))


def test_postgres_plan_and_apply_under_a_live_node(at_5: str) -> None:
    heartbeat(at_5, "old-live", 0)
    url = ["--store", "postgres", "--postgres-url", at_5]
    with beating(at_5, "old-live"):
        plan = troth("migrate", "plan", *url)
        assert plan.returncode == 0, plan
        assert "troth/store/postgres/migrations/006_rolling_upgrades.sql" in plan.stdout
        assert "005_" not in plan.stdout
        assert "nodes alive now: old-live (release older, schema -)" in plan.stdout
        assert stored(at_5) == 5
        apply = troth("migrate", "apply", *url)
    assert apply.returncode == 0, apply
    assert "migrating under live nodes: old-live" in apply.stderr
    assert stored(at_5) == len(load_migrations(PG))
    check = troth("migrate", "check", "--postgres-url", at_5)  # --store implied
    assert check.returncode == 0 and "up to date" in check.stdout


def test_postgres_serve_refuses_a_newer_schema_in_one_line() -> None:
    with pg.throwaway_database("troth_upgrade") as url:
        with psycopg.connect(url) as conn:
            schema = PgSchema(conn)
            schema.begin_exclusive()
            conn.execute("INSERT INTO schema_version VALUES (99, 'future', 0)")
            schema.commit()
        done = troth(
            "serve", "--store", "postgres", "--postgres-url", url, "--port", str(free_port())
        )
        assert done.returncode == EXIT_SCHEMA, done
        assert "version 99 is newer" in one_line(done.stderr)


def test_the_migration_connection_prepares_no_statement(at_5: str) -> None:
    """Behind a pooler in transaction mode a statement prepared on one server
    connection is missing on the next: the migration's connection (whose version
    checks repeat one query more often than psycopg's prepare threshold) must leave
    none on the server."""
    with open_schema("postgres", db="", postgres_url=at_5) as schema:
        assert isinstance(schema, PgSchema)
        for _ in range(10):
            assert schema.stored_version() == 5
            schema.live_nodes(5_000)
        prepared = schema.conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
    assert prepared == (0,)
