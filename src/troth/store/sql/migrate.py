"""Numbered schema migrations, one runner for every SQL dialect.

The schema lives in ``troth/store/<dialect>/migrations/NNN_name.sql``, one file per
version, applied in order.  ``schema_version`` records which ones a database has
seen, so opening a database brings it up to date and nothing else: a migration runs
exactly once.

Each migration runs in its own transaction holding the dialect's exclusive lock
(SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: a transaction-level advisory lock), and
the stored version is re-read *inside* that transaction, so two processes opening
the same database at once cannot both apply one migration: the second waits for
the lock, then sees the new version and skips.  A failing migration leaves the
database at the previous version (DDL is transactional on both).

A database whose version is newer than this code knows is refused before anything
is written to it: an older server must not guess at a schema it has never seen.  So
is one whose recorded migrations are not this code's (another build's version 5 is
not this one's).

Rolling upgrades (docs/operations.md, "Upgrades"): every migration is expand-only,
and what a newer schema derives from a row the database derives itself (triggers,
defaults), so a node of the previous release keeps writing correct rows under the
new schema.  Still, a server does not migrate on its own while other nodes'
heartbeats are alive (``live_within_ms``): it names them and leaves the step to the
operator (``troth migrate apply``), who knows which releases those nodes run.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from importlib import resources
from typing import Protocol, TypedDict

_FILE_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


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


class SchemaUnknown(SchemaError):
    """The database records migrations this code does not have under those numbers."""

    def __init__(self, version: int, found: str, expected: str) -> None:
        super().__init__(
            f"database schema version {version} is {found!r}, which this troth does not "
            f"know (its version {version} is {expected!r}); refusing to open it"
        )


class LiveNode(TypedDict):
    """A row of ``nodes`` whose heartbeat is recent (PostgreSQL)."""

    node: str
    url: str
    release: str | None
    schema: int | None


class OlderNodesAlive(SchemaError):
    """A server would migrate while other nodes are alive; it leaves that to the
    operator rather than change the schema under them unasked."""

    def __init__(self, found: int, known: int, nodes: list[LiveNode]) -> None:
        names = ", ".join(
            f"{n['node']} ({n['url']}, release {n['release'] or 'older'}, "
            f"schema {n['schema'] or f'<= {found}'})"
            for n in nodes
        )
        super().__init__(
            f"database schema version {found} needs migrating to {known}, and other nodes "
            f"are alive: {names}; not migrating under them unasked. Run `troth migrate "
            "apply` (safe while they run: migrations are expand-only), or stop them first, "
            "then start this node again"
        )
        self.nodes = nodes


@dataclass(frozen=True)
class Migration:
    """One ``NNN_name.sql`` file."""

    version: int
    name: str
    sql: str


@functools.cache
def load_migrations(package: str) -> tuple[Migration, ...]:
    """Every ``NNN_name.sql`` in ``<package>/migrations``, in version order (1 … N).

    Versions must be contiguous from 1: a gap means a file went missing from the
    package, and running the later ones on top of it would build a wrong schema.
    """
    found: list[Migration] = []
    for entry in resources.files(package).joinpath("migrations").iterdir():
        match = _FILE_NAME.match(entry.name)
        if match is None:
            continue
        found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise SchemaError(f"migrations must be numbered 1..N without gaps, found {versions}")
    return tuple(found)


class Schema(Protocol):
    """One dialect's connection, as the migration runner drives it."""

    #: The dialect's package, whose ``migrations/`` folder holds its schema.
    package: str

    def stored_version(self) -> int:
        """The database's schema version; 0 when it has none (a fresh database)."""

    def stored_names(self) -> dict[int, str]:
        """Version to name of every recorded migration (empty for a fresh database)."""

    def live_nodes(self, within_ms: int) -> list[LiveNode]:
        """Nodes whose heartbeat is younger than ``within_ms`` (none where the dialect
        has no ``nodes`` table)."""

    def begin_exclusive(self) -> None:
        """Open a transaction that excludes every other migrator until it ends, and
        make sure ``schema_version`` exists."""

    def apply(self, migration: Migration, applied_at: int) -> None:
        """Run the migration's SQL and record it in ``schema_version``."""

    def commit(self) -> None: ...

    def rollback(self) -> None:
        """End a failed transaction (never raises)."""


def latest_version(schema: Schema) -> int:
    """The schema version this code builds for the dialect."""
    return len(load_migrations(schema.package))


def check_version(schema: Schema) -> int:
    """Read the stored version and refuse one newer than this code knows, or one whose
    recorded migrations are not this code's.

    Only reads, so it can run before anything (even SQLite's ``journal_mode``) is
    changed."""
    found = schema.stored_version()
    known = latest_version(schema)
    if found > known:
        raise SchemaTooNew(found, known)
    if found:
        names = schema.stored_names()
        for migration in load_migrations(schema.package)[:found]:
            recorded = names.get(migration.version, "(missing)")
            if recorded != migration.name:
                raise SchemaUnknown(migration.version, recorded, migration.name)
    return found


def pending(schema: Schema) -> list[Migration]:
    """The migrations :func:`migrate` would apply now, in order (checks the version)."""
    found = check_version(schema)
    return [m for m in load_migrations(schema.package) if m.version > found]


def migrate(schema: Schema, *, live_within_ms: int | None = None, node: str | None = None) -> int:
    """Apply every migration newer than the stored version; return the final version.

    With ``live_within_ms``, refuse (:class:`OlderNodesAlive`) when a migration is due
    and a node other than ``node`` heartbeated within that many ms: what a server
    does on its own.  Without it, migrate regardless (``troth migrate apply``)."""
    found = check_version(schema)
    if found == latest_version(schema):
        return found  # the common case: no lock taken at all
    for migration in load_migrations(schema.package):
        if found >= migration.version:
            continue
        schema.begin_exclusive()
        try:
            found = check_version(schema)
            if found < migration.version and live_within_ms is not None:
                others = [n for n in schema.live_nodes(live_within_ms) if n["node"] != node]
                if others:
                    raise OlderNodesAlive(found, latest_version(schema), others)
                live_within_ms = None  # checked once, before the first migration
            if found < migration.version:
                schema.apply(migration, time.time_ns() // 1_000_000)
                found = migration.version
            schema.commit()
        except BaseException:
            schema.rollback()
            raise
    return found
