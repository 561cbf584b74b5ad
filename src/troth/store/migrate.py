"""Numbered schema migrations for the SQLite backend.

The schema lives in ``troth/store/sql/NNN_name.sql``, one file per version, applied
in order.  ``schema_version`` records which ones a database has seen, so opening a
database brings it up to date and nothing else: a migration runs exactly once.

Each migration runs in its own ``BEGIN IMMEDIATE`` transaction, and the stored
version is re-read *inside* that transaction, so two processes opening the same
file at once cannot both apply one migration (the second waits for the write lock,
then sees the new version and skips).  A failing migration leaves the database at
the previous version.

A database whose version is newer than this code knows is refused before anything
is written to it: an older server must not guess at a schema it has never seen.

The connection must be in autocommit mode (``isolation_level=None``): transactions
are opened here explicitly.  ``Connection.executescript`` is not usable for that,
because it commits any open transaction first; statements are split with
:func:`sqlite3.complete_statement` and executed one by one instead.
"""

from __future__ import annotations

import functools
import re
import sqlite3
import time
from dataclasses import dataclass
from importlib import resources

_FILE_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")

_CREATE_VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_version ("
    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)"
)


class SchemaError(RuntimeError):
    """The database's schema cannot be used by this code."""


class SchemaTooNew(SchemaError):
    """The database was written by a newer troth; it is left untouched."""

    def __init__(self, found: int, known: int) -> None:
        super().__init__(
            f"database schema version {found} is newer than the latest this troth knows "
            f"({known}); refusing to open it (upgrade troth, or use a fresh database)"
        )
        self.found = found
        self.known = known


@dataclass(frozen=True)
class Migration:
    """One ``NNN_name.sql`` file."""

    version: int
    name: str
    sql: str

    def statements(self) -> list[str]:
        return split_statements(self.sql)


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """Every SQLite migration shipped with the package (``sql/``), in version order."""
    return load_migrations("sql")


def load_migrations(folder: str) -> tuple[Migration, ...]:
    """Every ``NNN_name.sql`` in ``troth/store/<folder>``, in version order (1 … N).

    Versions must be contiguous from 1: a gap means a file went missing from the
    package, and running the later ones on top of it would build a wrong schema.
    """
    found: list[Migration] = []
    for entry in resources.files("troth.store").joinpath(folder).iterdir():
        match = _FILE_NAME.match(entry.name)
        if match is None:
            continue
        found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise SchemaError(f"migrations must be numbered 1..N without gaps, found {versions}")
    return tuple(found)


def latest_version() -> int:
    """The schema version this code builds."""
    return len(migrations())


def split_statements(script: str) -> list[str]:
    """Split a script into complete statements (comments before one stay attached).

    Accumulates line by line until :func:`sqlite3.complete_statement` says the text
    so far ends a statement, which understands string literals, comments and
    ``CREATE TRIGGER ... END;`` bodies (unlike splitting on ``;``).
    """
    out: list[str] = []
    buf: list[str] = []
    for line in script.splitlines(keepends=True):
        buf.append(line)
        text = "".join(buf)
        if sqlite3.complete_statement(text):
            out.append(text.strip())
            buf = []
    rest = [ln.strip() for ln in buf if ln.strip() and not ln.strip().startswith("--")]
    if rest:
        raise SchemaError(f"incomplete statement at end of migration: {' '.join(rest)!r}")
    return out


def current_version(conn: sqlite3.Connection) -> int:
    """The stored schema version; 0 for a database that has none (a new file)."""
    has_table = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    if has_table is None:
        return 0
    row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0]) if row is not None and row[0] is not None else 0


def check_version(conn: sqlite3.Connection) -> int:
    """Read the stored version and refuse one newer than :func:`latest_version`.

    Only reads, so it can run before anything (even ``journal_mode``) is changed.
    """
    found = current_version(conn)
    known = latest_version()
    if found > known:
        raise SchemaTooNew(found, known)
    return found


def migrate(conn: sqlite3.Connection) -> int:
    """Apply every migration newer than the stored version; return the final version."""
    if check_version(conn) == latest_version():
        return latest_version()  # the common case: no write lock taken at all
    for migration in migrations():
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(_CREATE_VERSION_TABLE)
            found = check_version(conn)
            if found >= migration.version:
                conn.execute("COMMIT")
                continue
            for statement in migration.statements():
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, time.time_ns() // 1_000_000),
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return check_version(conn)
