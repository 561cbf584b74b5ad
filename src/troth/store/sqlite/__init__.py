"""The SQLite store (the default): one database file, durable group commit."""

from troth.store.sqlite.store import SqliteBackend, SqliteOutbox, SqliteStore

__all__ = ["SqliteBackend", "SqliteOutbox", "SqliteStore"]
