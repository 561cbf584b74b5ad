"""The PostgreSQL side of the migration runner (``store/migrate.py``).

The exclusive lock is a transaction-level advisory lock, taken before anything else
(even ``CREATE TABLE IF NOT EXISTS`` fails when two sessions race on it), with no
``lock_timeout``: waiting for another node's migration is expected.
"""

from __future__ import annotations

from typing import Final

from troth.store.migrate import Migration
from troth.store.postgres.session import Conn

PACKAGE: Final = "troth.store.postgres"

#: ``pg_advisory_xact_lock`` key that serialises migrations across nodes ("troth").
_MIGRATION_LOCK: Final = 0x74726F7468
_CREATE_VERSION_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS schema_version ("
    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)"
)


class PgSchema:
    """``store.migrate.Schema`` over one PostgreSQL connection (not in autocommit)."""

    package = PACKAGE

    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    def stored_version(self) -> int:
        exists = self.conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()
        if exists is None or not exists[0]:
            return 0
        row = self.conn.execute("SELECT max(version) FROM schema_version").fetchone()
        return int(row[0]) if row is not None and row[0] is not None else 0

    def begin_exclusive(self) -> None:
        self.conn.rollback()  # whatever the version check left open
        self.conn.execute("SET LOCAL lock_timeout = 0")
        self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        self.conn.execute(_CREATE_VERSION_TABLE)

    def apply(self, migration: Migration, applied_at: int) -> None:
        self.conn.execute(migration.sql, prepare=False)
        self.conn.execute(
            "INSERT INTO schema_version (version, name, applied_at) VALUES (%s, %s, %s)",
            (migration.version, migration.name, applied_at),
        )

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        self.conn.rollback()
