"""Throwaway PostgreSQL databases for the postgres backend's tests.

Each test module (or test) gets a database of its own, with a random name, which is
dropped afterwards.  An unreachable server is an error, never a skip: CI starts
PostgreSQL (``.ci/run``), and a silently skipped backend is an untested one.

``TROTH_TEST_POSTGRES`` names the maintenance database to connect to (default: the
local cluster, user ``postgres``, database ``postgres``).  The databases are made and
dropped by :mod:`troth.bench.pg`, the bench's throwaway databases; this module names
the tests' server and what to do when it is unreachable.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager

from troth.bench import pg as bench_pg
from troth.store.postgres import PostgresStore

ADMIN_URL = os.environ.get("TROTH_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")

HOW_TO_START = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"

UNREACHABLE = (
    f"the postgres tests need it. Start it with: {HOW_TO_START} (or set TROTH_TEST_POSTGRES)"
)


def create_database(prefix: str = "troth_test") -> str:
    """Create an empty database with a random name; return its connection string."""
    return bench_pg.create_database(ADMIN_URL, prefix, hint=UNREACHABLE)


def drop_database(url: str) -> None:
    """Drop it, disconnecting whatever is still connected (a test that failed midway)."""
    bench_pg.drop_database(ADMIN_URL, url, hint=UNREACHABLE)


def throwaway_database(prefix: str = "troth_test") -> AbstractContextManager[str]:
    """A fresh database's connection string for the ``with`` block; dropped after."""
    return bench_pg.throwaway(ADMIN_URL, prefix, hint=UNREACHABLE)


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
