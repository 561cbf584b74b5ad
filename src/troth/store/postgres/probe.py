"""What a node checks of its database before it serves: that it can connect (TLS
and all), and that a connection it takes for a session is one.

Why before serving: a wrong CA, a refused password or a pooler in transaction mode
that the settings do not know of would otherwise show as a 500 on every write under
load (or a traceback at startup) rather than one line that names the cause.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

#: Seconds the probe waits for a connection (libpq's own default is forever).
CONNECT_TIMEOUT: Final = 10


class ProbeFailed(Exception):
    """The database cannot serve this node as configured; the message says why, on
    one line, without the URL (it may hold a password)."""


class Unreachable(ProbeFailed):
    """No connection could be made (nothing answers, a refused password or
    certificate): the store cannot be opened, rather than the settings contradicting
    what the database is; :attr:`setting` names the URL setting it came from."""

    def __init__(self, setting: str, detail: str) -> None:
        super().__init__(f"cannot use {setting}: {detail}")
        self.setting = setting
        self.detail = detail


def one_line(exc: BaseException) -> str:
    """An error's message on one line (libpq's span several)."""
    return " ".join(str(exc).split())


def _connect(url: str, application_name: str) -> psycopg.Connection[Any]:
    params = conninfo_to_dict(url)
    params.setdefault("connect_timeout", CONNECT_TIMEOUT)
    params["application_name"] = application_name
    conn = psycopg.connect(make_conninfo("", **params), autocommit=True)
    conn.prepare_threshold = None
    return conn


def _pid(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def keeps_session(url: str) -> bool:
    """Whether one client connection stays on one server session between its
    transactions: False behind a pooler in transaction (or statement) mode.

    Two connections: the first reads its server's pid, the second then holds a
    transaction (a pooler hands it the server connection the first just released,
    as PgBouncer does by default), and the first reads its pid again.  A direct
    connection, or a pooler in session mode, answers the same pid twice.  A pooler
    that happened to hand the same server connection back is not detected: the
    probe finds transaction pooling, it cannot prove its absence.
    """
    with _connect(url, "troth-probe") as first, _connect(url, "troth-probe") as second:
        before = _pid(first)
        with second.transaction():
            _pid(second)
            after = _pid(first)
    return before == after


def probe(url: str, *, pooled: bool, listen_url: str = "") -> None:
    """Raise :class:`ProbeFailed` when this node cannot work with the database as
    configured (``pooled``: ``postgres_pool_mode = transaction``)."""
    try:
        session = keeps_session(url)
    except psycopg.Error as exc:
        raise Unreachable("postgres_url", one_line(exc)) from None
    if not session and not pooled:
        raise ProbeFailed(
            "postgres_url leads to a pooler in transaction mode (one connection's "
            "transactions ran on different server sessions): set postgres_pool_mode = "
            "transaction, or point postgres_url at a pooler in session mode"
        )
    if listen_url:
        try:
            listening = keeps_session(listen_url)
        except psycopg.Error as exc:
            raise Unreachable("postgres_listen_url", one_line(exc)) from None
        if not listening:
            raise ProbeFailed(
                "postgres_listen_url leads to a pooler in transaction mode: LISTEN needs "
                "a session (a direct connection, or a pooler in session mode)"
            )
