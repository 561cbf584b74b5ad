"""The PostgreSQL side of the migration runner (``store/sql/migrate.py``).

The exclusive lock is a transaction-level advisory lock, taken before anything else
(even ``CREATE TABLE IF NOT EXISTS`` fails when two sessions race on it), with no
``lock_timeout``: waiting for another node's migration is expected.
"""

from __future__ import annotations

from typing import Final

from troth.store.postgres.session import Conn
from troth.store.sql.migrate import LiveNode, Migration

PACKAGE: Final = "troth.store.postgres"

#: ``pg_advisory_xact_lock`` key that serialises migrations across nodes ("troth").
_MIGRATION_LOCK: Final = 0x74726F7468
_CREATE_VERSION_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS schema_version ("
    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)"
)


class PgSchema:
    """``store.sql.migrate.Schema`` over one PostgreSQL connection (not in autocommit)."""

    package = PACKAGE

    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    def stored_version(self) -> int:
        if not self._has("schema_version"):
            return 0
        row = self.conn.execute("SELECT max(version) FROM schema_version").fetchone()
        return int(row[0]) if row is not None and row[0] is not None else 0

    def stored_names(self) -> dict[int, str]:
        rows = self.conn.execute("SELECT version, name FROM schema_version").fetchall()
        return {int(r[0]): str(r[1]) for r in rows}

    def live_nodes(self, within_ms: int) -> list[LiveNode]:
        """Read as ``to_jsonb`` rows: the columns a node of an older release left
        out (``release``, ``schema_version``) are simply absent."""
        if not self._has("nodes"):
            return []
        rows = self.conn.execute(
            "SELECT to_jsonb(n) FROM nodes n WHERE seen_at >= "
            "extract(epoch FROM clock_timestamp()) * 1000 - %s ORDER BY node",
            (within_ms,),
        ).fetchall()
        return [
            LiveNode(
                node=str(r[0]["node"]),
                url=str(r[0]["url"]),
                release=r[0].get("release"),
                schema=r[0].get("schema_version"),
            )
            for r in rows
        ]

    def _has(self, table: str) -> bool:
        row = self.conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
        return bool(row and row[0])

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
