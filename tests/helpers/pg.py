"""Throwaway PostgreSQL databases for the postgres backend's tests.

Each test module (or test) gets a database of its own, with a random name, which is
dropped afterwards.  An unreachable server is an error, never a skip: CI starts
PostgreSQL (``.ci/run``), and a silently skipped backend is an untested one.

``TROTH_TEST_POSTGRES`` names the maintenance database to connect to (default: the
local cluster, user ``postgres``, database ``postgres``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from troth.store.postgres import PostgresStore

ADMIN_URL = os.environ.get("TROTH_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")

HOW_TO_START = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"


def _admin() -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        raise RuntimeError(
            f"PostgreSQL is unreachable at {ADMIN_URL} ({exc}); the postgres tests need it. "
            f"Start it with: {HOW_TO_START} (or set TROTH_TEST_POSTGRES)"
        ) from exc


def url_of(name: str) -> str:
    """The connection string of database ``name`` on the admin URL's server."""
    params = conninfo_to_dict(ADMIN_URL)
    params["dbname"] = name
    return make_conninfo("", **params)


def create_database(prefix: str = "troth_test") -> str:
    """Create an empty database with a random name; return its name."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name


def drop_database(name: str) -> None:
    """Drop it, disconnecting whatever is still connected (a test that failed midway)."""
    with _admin() as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@contextmanager
def throwaway_database(prefix: str = "troth_test") -> Iterator[str]:
    """A fresh database's connection string for the ``with`` block; dropped after."""
    name = create_database(prefix)
    try:
        yield url_of(name)
    finally:
        drop_database(name)


def fresh_store(url: str) -> PostgresStore:
    """A store on a shared test database, emptied (TRUNCATE is much faster than a new DB)."""
    store = PostgresStore(url)
    store.reset()
    return store
