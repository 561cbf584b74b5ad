"""Throwaway PostgreSQL databases for the postgres backend's tests.

Each test module (or test) gets a database of its own, with a random name, which is
dropped afterwards.  An unreachable server is an error, never a skip: CI starts
PostgreSQL (``.ci/run``), and a silently skipped backend is an untested one.

``TROTH_TEST_POSTGRES`` names the maintenance database to connect to (default: the
local cluster, user ``postgres``, database ``postgres``).  The bench makes its own
throwaway databases the same way (``troth_bench.pg``, in the separate ``troth-bench``
distribution): the tests never import the bench.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from troth.store.postgres import PostgresStore

ADMIN_URL = os.environ.get("TROTH_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")

HOW_TO_START = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"

UNREACHABLE = (
    f"the postgres tests need it. Start it with: {HOW_TO_START} (or set TROTH_TEST_POSTGRES)"
)


def url_of(base: str, dbname: str) -> str:
    """``base`` pointed at database ``dbname`` (same host, port, user, options)."""
    params = conninfo_to_dict(base)
    params["dbname"] = dbname
    return make_conninfo("", **params)


def dbname_of(url: str) -> str:
    return str(conninfo_to_dict(url).get("dbname") or "")


def _admin() -> psycopg.Connection[tuple[Any, ...]]:
    try:
        return psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise RuntimeError(
            f"PostgreSQL is unreachable at {ADMIN_URL} ({exc}); {UNREACHABLE}"
        ) from exc


def create_database(prefix: str = "troth_test") -> str:
    """Create an empty database with a random name; return its connection string."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with _admin() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return url_of(ADMIN_URL, name)


def drop_database(url: str) -> None:
    """Drop it, disconnecting whatever is still connected (a test that failed midway)."""
    with _admin() as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(dbname_of(url))
            )
        )


@contextmanager
def throwaway_database(prefix: str = "troth_test") -> Iterator[str]:
    """A fresh database's connection string for the ``with`` block; dropped after."""
    url = create_database(prefix)
    try:
        yield url
    finally:
        drop_database(url)


def fresh_store(url: str) -> PostgresStore:
    """A store on a shared test database, emptied (TRUNCATE is much faster than a new DB)."""
    store = PostgresStore(url)
    store.reset()
    return store


def through(url: str, port: int) -> str:
    """``url`` by way of a TCP proxy on local ``port`` (tests/helpers/lb.py), giving up
    a connection attempt after 2 s: the outage tests stop and start the proxy."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(url)
    params["host"], params["port"] = "127.0.0.1", str(port)
    params["connect_timeout"] = "2"
    return make_conninfo("", **params)
