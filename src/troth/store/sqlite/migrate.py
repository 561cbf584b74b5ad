"""The SQLite side of the migration runner (``store/sql/migrate.py``).

The connection is in autocommit mode (``isolation_level=None``): transactions are
opened here explicitly, with ``BEGIN IMMEDIATE`` (the write lock) as the exclusive
lock.  ``Connection.executescript`` would commit the open transaction first, so a
migration's statements are split with :func:`sqlite3.complete_statement` and run
one by one.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from troth.store.sql.migrate import LiveNode, Migration, SchemaError

PACKAGE: Final = "troth.store.sqlite"

_CREATE_VERSION_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS schema_version ("
    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)"
)


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


class SqliteSchema:
    """``store.sql.migrate.Schema`` over one SQLite connection."""

    package = PACKAGE

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def stored_version(self) -> int:
        has_table = self.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
        ).fetchone()
        if has_table is None:
            return 0
        row = self.conn.execute("SELECT max(version) FROM schema_version").fetchone()
        return int(row[0]) if row is not None and row[0] is not None else 0

    def stored_names(self) -> dict[int, str]:
        rows = self.conn.execute("SELECT version, name FROM schema_version").fetchall()
        return {int(r[0]): str(r[1]) for r in rows}

    def live_nodes(self, within_ms: int) -> list[LiveNode]:
        return []  # one process serves a SQLite file: there are no peers to heartbeat

    def begin_exclusive(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute(_CREATE_VERSION_TABLE)

    def apply(self, migration: Migration, applied_at: int) -> None:
        for statement in split_statements(migration.sql):
            self.conn.execute(statement)
        self.conn.execute(
            "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
            (migration.version, migration.name, applied_at),
        )

    def commit(self) -> None:
        self.conn.execute("COMMIT")

    def rollback(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")
