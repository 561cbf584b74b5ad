"""The schema of a store as an operator sees it before serving: where it stands, what
would run, and running it (``troth migrate``, and ``troth serve``'s check at start).

``serve`` and ``migrate apply`` differ in one thing (docs/operations.md, "Upgrades"):
``serve`` migrates on its own only when no other node's heartbeat is alive; ``apply``
is the operator saying "migrate now", under live nodes of the previous release if
need be, which the expand-only rule makes safe.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from troth.store.sql.migrate import (
    LiveNode,
    Migration,
    Schema,
    check_version,
    latest_version,
    load_migrations,
    migrate,
)

#: Exit status of ``troth serve`` and ``troth migrate`` refusing a database's schema
#: (newer, unknown, or due a migration while other nodes are alive).
EXIT_SCHEMA = 4


@dataclass
class Status:
    """Where a database's schema stands against this code."""

    #: ``sqlite`` or ``postgres``.
    dialect: str
    stored: int
    latest: int
    #: What ``migrate`` would apply, in order.
    pending: list[Migration] = field(default_factory=list)
    #: Nodes heartbeating now (PostgreSQL), by whom a migration would run.
    live: list[LiveNode] = field(default_factory=list)


def sql_file(schema: Schema, migration: Migration) -> str:
    """The migration's file as packaged, e.g.
    ``troth/store/postgres/migrations/006_rolling_upgrades.sql``."""
    folder = schema.package.replace(".", "/")
    return f"{folder}/migrations/{migration.version:03d}_{migration.name}.sql"


@contextmanager
def open_schema(store: str, *, db: str, postgres_url: str) -> Iterator[Schema]:
    """The schema of the configured store, on a connection of its own (closed after).

    A SQLite file that does not exist is not created here: it reads as version 0."""
    if store == "postgres":
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        from troth.store.postgres.migrate import PgSchema

        params = conninfo_to_dict(postgres_url)
        params.setdefault("connect_timeout", 10)
        params.setdefault("application_name", "troth-migrate")
        with psycopg.connect(make_conninfo("", **params)) as conn:
            # No server-side prepared statement: behind a pooler in transaction mode
            # the next transaction may run on another server connection, which has
            # never seen it ("prepared statement _pg3_0 does not exist").
            conn.prepare_threshold = None
            try:
                yield PgSchema(conn)
            finally:
                conn.rollback()
        return
    if store != "sqlite":
        raise ValueError(f"no schema to migrate in a {store} store")
    from troth.store.sqlite.migrate import SqliteSchema

    lite = sqlite3.connect(db if os.path.exists(db) else ":memory:", isolation_level=None)
    try:
        yield SqliteSchema(lite)
    finally:
        lite.close()


def status(schema: Schema, live_within_ms: int) -> Status:
    """Read where the schema stands (refusing a newer or unknown one, as ``serve``)."""
    found = check_version(schema)
    return Status(
        dialect="postgres" if schema.package.endswith("postgres") else "sqlite",
        stored=found,
        latest=latest_version(schema),
        pending=[m for m in load_migrations(schema.package) if m.version > found],
        live=schema.live_nodes(live_within_ms),
    )


def apply_sqlite(db: str) -> int:
    """Bring a SQLite file up to date as the server would on opening it (the same
    pragmas for a new file); returns the version reached."""
    from troth.store.sqlite import SqliteStore

    store = SqliteStore(db)
    try:
        return store.schema_version()
    finally:
        store.close()


def prepare(
    store: str, *, db: str, postgres_url: str, node_timeout: float, node: str | None
) -> int:
    """What ``serve`` does before it builds anything: refuse a newer or unknown schema,
    and on PostgreSQL migrate unless other nodes are alive (``OlderNodesAlive``).
    A SQLite file is migrated when the store opens it."""
    with open_schema(store, db=db, postgres_url=postgres_url) as schema:
        if store != "postgres":
            return check_version(schema)
        return migrate(schema, live_within_ms=round(node_timeout * 1000), node=node)
