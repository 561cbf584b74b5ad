"""The SQLite store (the default): one database file, durable group commit."""

from troth.store.sqlite.backend import SqliteBackend
from troth.store.sqlite.store import SqliteOutbox, SqliteStore

__all__ = ["SqliteBackend", "SqliteOutbox", "SqliteStore"]
