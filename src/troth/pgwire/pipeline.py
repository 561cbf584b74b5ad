"""A connection's statements in one libpq pipeline: one round trip per call,
statements prepared on their second use, the first error raised after the sync."""

from __future__ import annotations

import select
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Final

import psycopg
from psycopg import pq
from psycopg.adapt import Transformer
from psycopg.errors import error_from_result

from troth.pgwire.libpq import BYTES_DATA, LibPq, loaded_libpq
from troth.pgwire.params import Parsed, Unencodable, encode

#: The statement that starts a transaction (psycopg's own, for READ COMMITTED).
BEGIN: Final = "BEGIN ISOLATION LEVEL READ COMMITTED"
_BEGIN: Final = BEGIN.encode()

#: Prepared statements per connection; statement texts beyond it are sent unnamed.
MAX_PREPARED: Final = 256
#: Uses of a statement (text and parameter types) before it is prepared: a statement
#: sent once (retention's ``IN (…)`` of an odd length, say) does not take a place.
PREPARE_AFTER: Final = 1

_OK: Final = pq.ExecStatus.COMMAND_OK
_TUPLES: Final = pq.ExecStatus.TUPLES_OK
_FATAL: Final = pq.ExecStatus.FATAL_ERROR
_SYNC: Final = pq.ExecStatus.PIPELINE_SYNC
IDLE: Final = pq.TransactionStatus.IDLE
_PIPELINE_OFF: Final = pq.PipelineStatus.OFF


Rows = list[tuple[Any, ...]]
#: A prepared statement's key: its text and its parameters' type oids.
Key = tuple[str, tuple[int, ...]]
#: What a pipeline's result answers: a statement's index, the Parse of a key
#: (under a name), or None (the BEGIN sent first).
Slot = int | tuple[Key, bytes] | None


class Wire:
    """A psycopg connection's statements sent through libpq's pipeline calls.

    Used by one thread at a time (the :class:`~troth.store.postgres.session.Session`
    lock), never while psycopg itself is in a pipeline on the connection.
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        *,
        prepare: bool = True,
        after_begin: Sequence[str] = (),
    ) -> None:
        self.conn = conn
        self.pg = conn.pgconn
        conn.prepare_threshold = None  # ours only (see the module's docstring)
        #: Whether statements may be prepared on the server (not behind a pooler in
        #: transaction mode).
        self.prepare = prepare
        #: Statements sent right after each BEGIN this wire sends (``SET LOCAL …``).
        self.after_begin: tuple[bytes, ...] = tuple(sql.encode() for sql in after_begin)
        self.encoding = conn.info.encoding
        self.loader = Transformer(conn)
        self.parsed: dict[str, Parsed] = {}
        #: (statement text, parameter oids) -> its prepared statement's name.
        self.prepared: dict[Key, bytes] = {}
        self.counter = 0
        #: Uses of statements not prepared yet (cleared as each is prepared).
        self.uses: dict[Key, int] = {}
        # poll, not select: a node with thousands of SSE sockets may get a descriptor
        # above select's 1024 for a connection it reopens.
        self.readable = select.poll()
        self.readable.register(self.pg.socket, select.POLLIN)
        self.either = select.poll()
        self.either.register(self.pg.socket, select.POLLIN | select.POLLOUT)
        #: Rows each statement of the last :meth:`run` returned or changed (-1: none
        #: reported), as psycopg's ``rowcount``.
        self.counts: list[int] = []

    def _encode(
        self, sql: str, params: Any
    ) -> tuple[Parsed, list[bytes | None], tuple[int, ...], list[int]]:
        parsed = self.parsed.get(sql)
        if parsed is None:
            parsed = self.parsed[sql] = Parsed(sql)
        values: list[bytes | None] = []
        oids: list[int] = []
        formats: list[int] = []
        if parsed.names:
            if params is None:
                raise Unencodable("a statement with placeholders needs parameters")
            for name, kind in zip(parsed.names, parsed.kinds, strict=True):
                data, oid, fmt = encode(params[name], kind)
                values.append(data)
                oids.append(oid)
                formats.append(fmt)
        elif params:
            raise Unencodable("parameters for a statement without placeholders")
        return parsed, values, tuple(oids), formats

    def run(self, statements: Sequence[tuple[str, Any]]) -> list[Rows | None]:
        """Execute ``statements`` (text, parameters) in one round trip; the rows of
        each (None for a statement that returns none).  Raises :class:`Unencodable`
        before sending anything, else the first failed statement's error."""
        encoded = [(sql, *self._encode(sql, params)) for sql, params in statements]
        pg = self.pg
        if pg.pipeline_status != _PIPELINE_OFF:
            raise psycopg.ProgrammingError("the connection is already in a pipeline")
        begin = not self.conn.autocommit and pg.transaction_status == IDLE
        pg.enter_pipeline_mode()
        slots: list[Slot] = []
        try:
            send = self._sender()
            if begin:
                for query in (_BEGIN, *self.after_begin):
                    send.params(query, [], (), [])
                    slots.append(None)
            parsing: dict[Key, bytes] = {}
            for i, (sql, parsed, values, oids, formats) in enumerate(encoded):
                key = (sql, oids)
                name = self.prepared.get(key) or parsing.get(key)
                if (
                    name is None
                    and parsed.names
                    and self.prepare
                    and len(self.prepared) < MAX_PREPARED
                    and self._used(key)
                ):
                    self.counter += 1
                    name = parsing[key] = b"troth_%d" % self.counter
                    send.prepare(name, parsed.query, oids)
                    slots.append((key, name))
                if name is None:  # no parameters (nothing to plan once), or too many
                    send.params(parsed.query, values, oids, formats)
                else:
                    send.prepared(name, values, formats)
                slots.append(i)
            pg.pipeline_sync()
            self._send()
            out, error = self._receive(slots, len(encoded), send.busy)
            pg.exit_pipeline_mode()
        except BaseException:
            self._abandon()
            raise
        if error is not None:
            raise error
        return out

    def _used(self, key: Key) -> bool:
        """Count a use of a statement not prepared; whether it has been used often
        enough to be prepared now (:data:`PREPARE_AFTER`)."""
        uses = self.uses.get(key, 0)
        if uses >= PREPARE_AFTER:
            self.uses.pop(key, None)
            return True
        if len(self.uses) >= 4 * MAX_PREPARED:
            self.uses.clear()  # statements sent once each, without end: forget them
        self.uses[key] = uses + 1
        return False

    def _send(self) -> None:
        """Flush libpq's output, reading input meanwhile (the server may answer
        before it has read everything)."""
        pg = self.pg
        while pg.flush():
            if any(events & select.POLLIN for _, events in self.either.poll()):
                pg.consume_input()

    def _sender(self) -> Sender:
        lib = loaded_libpq()
        return Sender(self.pg) if lib is None else HeldSender(self.pg, lib)

    def _next(self, busy: Callable[[], int]) -> pq.abc.PGresult | None:
        """The next result, waiting for the socket while libpq is ``busy``."""
        pg = self.pg
        while busy():
            self.readable.poll()
            pg.consume_input()
        return pg.get_result()

    def _receive(
        self,
        slots: list[Slot],
        count: int,
        busy: Callable[[], int],
    ) -> tuple[list[Rows | None], psycopg.Error | None]:
        out: list[Rows | None] = [None] * count
        counts = self.counts = [-1] * count
        error: psycopg.Error | None = None
        loader = self.loader
        for slot in slots:
            res = self._next(busy)
            while res is not None:
                status = res.status
                if status == _TUPLES and isinstance(slot, int):
                    loader.set_pgresult(res)
                    out[slot] = loader.load_rows(0, res.ntuples, tuple)
                    counts[slot] = res.ntuples
                elif status == _OK and isinstance(slot, int):
                    tuples = res.command_tuples
                    counts[slot] = -1 if tuples is None else tuples
                elif status == _OK and isinstance(slot, tuple):
                    self.prepared[slot[0]] = slot[1]
                elif status == _FATAL and error is None:
                    error = error_from_result(res, encoding=self.encoding)
                res = self._next(busy)
        res = self._next(busy)
        if res is None or res.status != _SYNC:
            raise psycopg.InterfaceError("pipeline out of step: no sync where one was due")
        return out, error

    def _abandon(self) -> None:
        """After a failure mid-pipeline (a lost connection, or a bug): leave the
        connection usable, or close it so its session reconnects (nothing of an
        unfinished transaction was acknowledged)."""
        if self.conn.closed:
            return
        try:
            if self.pg.pipeline_status != _PIPELINE_OFF:
                self.pg.exit_pipeline_mode()
        except psycopg.Error:
            self.conn.close()


class Sender:
    """Sends a pipeline's statements with psycopg's wrapper of libpq."""

    def __init__(self, pg: pq.abc.PGconn) -> None:
        self.pg = pg

    def busy(self) -> int:
        """Whether libpq waits for more input before it has a result (PQisBusy)."""
        return self.pg.is_busy()

    def params(
        self, query: bytes, values: list[bytes | None], oids: tuple[int, ...], formats: list[int]
    ) -> None:
        self.pg.send_query_params(query, values or None, oids or None, formats or None)

    def prepare(self, name: bytes, query: bytes, oids: tuple[int, ...]) -> None:
        self.pg.send_prepare(name, query, oids)

    def prepared(self, name: bytes, values: list[bytes | None], formats: list[int]) -> None:
        self.pg.send_query_prepared(name, values, formats)


class HeldSender(Sender):
    """Sends them with libpq's functions called holding the GIL (:class:`LibPq`)."""

    def __init__(self, pg: pq.abc.PGconn, lib: LibPq) -> None:
        super().__init__(pg)
        self.lib = lib
        ptr: int | None = getattr(pg, "pgconn_ptr", None)
        if ptr is None:
            raise psycopg.OperationalError("the connection is closed")
        self.ptr = ptr

    def busy(self) -> int:
        return int(self.lib.is_busy(self.ptr))

    def _check(self, ok: int) -> None:
        if not ok:
            message = self.pg.error_message.decode(errors="replace").strip()
            raise psycopg.OperationalError(f"sending a statement failed: {message}")

    @staticmethod
    def _arrays(values: list[bytes | None], formats: list[int]) -> tuple[Any, Any, Any]:
        """The values' addresses, their lengths and formats, as ``array`` buffers (the
        caller keeps them, and ``values``, alive across the call)."""
        if not values:
            return None, None, None
        return (
            array("Q", [0 if v is None else id(v) + BYTES_DATA for v in values]),
            array("i", [0 if v is None else len(v) for v in values]),
            array("i", formats),
        )

    @staticmethod
    def _at(buffer: array[int] | None) -> int | None:
        return None if buffer is None else buffer.buffer_info()[0]

    def params(
        self, query: bytes, values: list[bytes | None], oids: tuple[int, ...], formats: list[int]
    ) -> None:
        vals, lens, fmts = self._arrays(values, formats)
        types = array("I", oids) if oids else None
        at = self._at
        ok = self.lib.send_params(
            self.ptr, query, len(values), at(types), at(vals), at(lens), at(fmts), 0
        )
        self._check(ok)

    def prepare(self, name: bytes, query: bytes, oids: tuple[int, ...]) -> None:
        types = array("I", oids) if oids else None
        self._check(self.lib.send_prepare(self.ptr, name, query, len(oids), self._at(types)))

    def prepared(self, name: bytes, values: list[bytes | None], formats: list[int]) -> None:
        vals, lens, fmts = self._arrays(values, formats)
        at = self._at
        self._check(
            self.lib.send_prepared(self.ptr, name, len(values), at(vals), at(lens), at(fmts), 0)
        )
