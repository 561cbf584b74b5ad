"""The cursor a PostgreSQL session hands out: statements through the wire, and
through psycopg for what the wire does not send."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from troth.pgwire.params import Unencodable
from troth.pgwire.pipeline import BEGIN, IDLE, Rows, Wire


class WireCursor:
    """The cursor a :class:`~troth.store.postgres.session.Session` hands out: its
    ``execute`` goes through the connection's :class:`Wire` (one round trip, the
    statement prepared once), and through psycopg for what the wire does not send."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        *,
        prepare: bool = True,
        after_begin: Sequence[str] = (),
    ) -> None:
        self.connection = conn
        self.wire = Wire(conn, prepare=prepare, after_begin=after_begin)
        self._begin: list[tuple[str, Any]] = [(BEGIN, None), *((sql, None) for sql in after_begin)]
        self.cur = conn.cursor()
        self._rows: Rows | None = None
        self._at = 0
        self.rowcount = -1

    def execute(self, sql: str, params: Any = None, *, prepare: bool | None = None) -> WireCursor:
        self._rows, self._at = None, 0
        if prepare is not False:
            try:
                self._rows = self.wire.run([(sql, params)])[0] or []
                self.rowcount = self.wire.counts[0]
                return self
            except Unencodable:
                pass
        self._begin_here()
        self.cur.execute(sql, params, prepare=False if not self.wire.prepare else prepare)
        self.rowcount = self.cur.rowcount
        self._rows = self.cur.fetchall() if self.cur.pgresult and self.cur.description else []
        return self

    def run(self, statements: Sequence[tuple[str, Any]]) -> list[Rows | None]:
        """Several statements in one round trip (:meth:`Wire.run`), through psycopg's
        pipeline when one of them has a parameter the wire does not send."""
        try:
            return self.wire.run(statements)
        except Unencodable:
            return self._psycopg_pipeline(statements)

    def begin_statements(self) -> list[tuple[str, Any]]:
        """A BEGIN to send as a statement of a pipeline, with what follows it."""
        return self._begin

    def _begin_here(self) -> None:
        """Before psycopg itself starts a transaction: start it through the wire when
        statements must follow its BEGIN (psycopg would send the BEGIN alone)."""
        conn = self.connection
        if self.wire.after_begin and not conn.autocommit and conn.pgconn.transaction_status == IDLE:
            self.wire.run([])

    def _psycopg_pipeline(self, statements: Sequence[tuple[str, Any]]) -> list[Rows | None]:
        self._begin_here()
        conn = self.connection
        cursors = [conn.cursor() for _ in statements]
        first: psycopg.Error | None = None
        try:
            try:
                with conn.pipeline():
                    try:
                        for c, (sql, params) in zip(cursors, statements, strict=True):
                            c.execute(sql, params)
                    except psycopg.Error as exc:
                        first = exc
            except psycopg.Error as exc:
                first = first or exc
            if first is not None:
                raise first
            return [c.fetchall() if c.description else None for c in cursors]
        finally:
            for c in cursors:
                c.close()

    def fetchall(self) -> Rows:
        rows = self._rows or []
        out = rows[self._at :]
        self._at = len(rows)
        return out

    def fetchone(self) -> tuple[Any, ...] | None:
        rows = self._rows or []
        if self._at >= len(rows):
            return None
        self._at += 1
        return rows[self._at - 1]

    def __iter__(self) -> Any:
        return iter(self.fetchall())

    def executemany(self, sql: str, params_seq: Sequence[Any]) -> None:
        self._begin_here()
        self.cur.executemany(sql, params_seq)

    def close(self) -> None:
        self.cur.close()
