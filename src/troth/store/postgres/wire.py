"""Statements sent with libpq's own pipeline calls, under psycopg's cursor layer.

Why: psycopg's cursor and pipeline machinery cost the writer thread far more than
the statements themselves.  A prefetch-like pipeline (``BEGIN``, two ``SET LOCAL``,
a locked read of 20 ids, two ``SET LOCAL``, ``COMMIT``) takes ~255 µs of the
calling thread's CPU through cursors in a ``conn.pipeline()`` block, and ~52 µs
sent here (docs/performance-notes.md, "Statements under psycopg's cursor layer").  A
node is bound by the CPU of its one process (event loop and writer under one
GIL), so what the writer saves, the node can spend on requests.

What it keeps from psycopg: the connection (connect, reconnect, ``commit``,
``rollback``, transaction status — all read live from libpq), its error classes
(a failed statement raises what psycopg would: ``sqlstate`` and all), and its
compiled row loaders (numeric columns as ``int``, :data:`session.IntLoader`).

What it does itself:

- Each statement with parameters is prepared on its second use on a connection,
  under a name of its own, and then executed by name; psycopg's own preparing is switched off on the
  connection (``prepare_threshold = None``), since psycopg answers a ``ROLLBACK``
  on a connection where it prepared statements with ``DEALLOCATE ALL``, which would
  drop these too.  A name counts as prepared only once its Parse succeeded.
- Parameters are sent as psycopg's placeholders (``%s``, ``%b``, ``%(name)s``)
  say, converted once per statement text to ``$n``.  Values: ``str``, ``int``,
  ``bool``, None, ``bytes`` and lists of ``str`` / None (``text[]``, binary) or of
  ``bool`` (``bool[]``).  Anything else is :class:`Unencodable`: the caller sends
  that statement through psycopg instead.
- Statements of one call go in one pipeline with one sync (one round trip); the
  first error is raised after the sync, as a psycopg error.  When the connection
  is not in a transaction and not in autocommit, a ``BEGIN`` goes first, as
  psycopg's cursor would send it.
- Behind a pooler in transaction mode (``prepare=False``), one server connection
  serves many clients' transactions in turn: a name prepared on one is unknown on
  (or taken by another client on) the next.  Nothing is then prepared: every
  statement goes unnamed (Parse, Bind, Execute in the same pipeline), and the
  session's settings go as ``SET LOCAL`` after each ``BEGIN`` (:attr:`Wire.after_begin`).
"""

from __future__ import annotations

import ctypes
import re
import select
import struct
from array import array
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, Final

import psycopg
from psycopg import pq
from psycopg.adapt import Transformer
from psycopg.errors import error_from_result

#: The statement that starts a transaction (psycopg's own, for READ COMMITTED).
BEGIN: Final = "BEGIN ISOLATION LEVEL READ COMMITTED"
_BEGIN: Final = BEGIN.encode()

#: Type oids sent with parameters (0: let PostgreSQL infer it from the statement).
_UNKNOWN: Final = 0
_BOOL: Final = 16
_BYTEA: Final = 17
_INT8: Final = 20
_TEXT: Final = 25
_NUMERIC: Final = 1700
_BOOL_ARRAY: Final = 1000
TEXT_ARRAY_OID: Final = 1009
_INT8_MIN: Final = -(2**63)
_INT8_MAX: Final = 2**63 - 1

#: Prepared statements per connection; statement texts beyond it are sent unnamed.
MAX_PREPARED: Final = 256
#: Uses of a statement (text and parameter types) before it is prepared: a statement
#: sent once (retention's ``IN (…)`` of an odd length, say) does not take a place.
PREPARE_AFTER: Final = 1

_ARRAY_HEAD: Final = struct.Struct("!iiIii").pack  # ndim, has nulls, item oid, size, lbound
_ITEM_LEN: Final = struct.Struct("!i").pack
_NULL_ITEM: Final = _ITEM_LEN(-1)
_TRUE_ITEM: Final = _ITEM_LEN(1) + b"\x01"
_FALSE_ITEM: Final = _ITEM_LEN(1) + b"\x00"
_EMPTY_TEXT_ARRAY: Final = struct.pack("!iiI", 0, 0, _TEXT)  # ndim 0, no nulls, item oid

_PLACEHOLDER: Final = re.compile(r"%(?:\((\w+)\))?([bst%])")

_OK: Final = pq.ExecStatus.COMMAND_OK
_TUPLES: Final = pq.ExecStatus.TUPLES_OK
_FATAL: Final = pq.ExecStatus.FATAL_ERROR
_SYNC: Final = pq.ExecStatus.PIPELINE_SYNC
_IDLE: Final = pq.TransactionStatus.IDLE
_PIPELINE_OFF: Final = pq.PipelineStatus.OFF

Rows = list[tuple[Any, ...]]
#: A prepared statement's key: its text and its parameters' type oids.
Key = tuple[str, tuple[int, ...]]
#: What a pipeline's result answers: a statement's index, the Parse of a key
#: (under a name), or None (the BEGIN sent first).
Slot = int | tuple[Key, bytes] | None


class _LibPq:
    """The libpq calls the wire makes that psycopg's binary wrapper makes with the
    GIL released (``send_*``, ``is_busy``), made with it held: they never block (the
    connection is non-blocking) and take microseconds, while taking the GIL back
    after each waits behind the event loop's thread for up to the switch interval
    (``server/run.py``) — measured, dozens of such waits per batch."""

    def __init__(self, path: str) -> None:
        lib = ctypes.PyDLL(path)  # PyDLL: calls keep the GIL
        # Parameter arrays go as addresses of ``array`` buffers, and each value as the
        # address of its bytes object's data: building ctypes arrays of ``c_char_p``
        # cost ~11 µs per statement of 14 parameters (measured), this ~5.
        p, i, c = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
        self.send_params = lib.PQsendQueryParams
        self.send_params.argtypes = [p, c, i, p, p, p, p, i]
        self.send_prepare = lib.PQsendPrepare
        self.send_prepare.argtypes = [p, c, c, i, p]
        self.send_prepared = lib.PQsendQueryPrepared
        self.send_prepared.argtypes = [p, c, i, p, p, p, i]
        self.is_busy = lib.PQisBusy
        self.is_busy.argtypes = [p]
        for f in (self.send_params, self.send_prepare, self.send_prepared, self.is_busy):
            f.restype = i


#: Where a ``bytes`` object's data starts, from its address (CPython's layout; checked
#: by :func:`_libpq` before the wire relies on it).
_BYTES_DATA: Final = bytes.__basicsize__ - 1


def _layout_holds() -> bool:
    probe = b"troth wire probe"
    return (
        array("Q").itemsize == ctypes.sizeof(ctypes.c_void_p)
        and array("i").itemsize == ctypes.sizeof(ctypes.c_int)
        and array("I").itemsize == ctypes.sizeof(ctypes.c_uint)
        and ctypes.string_at(id(probe) + _BYTES_DATA, len(probe)) == probe
    )


@cache
def _libpq() -> _LibPq | None:
    """The libpq psycopg loaded (its connections' pointers are that library's), or
    None when it cannot be told for sure — not exactly one libpq in this process's
    maps (calling one build's functions on another's connection would corrupt
    memory) — and then psycopg's own calls are made."""
    if not _layout_holds():
        return None
    try:
        with open("/proc/self/maps") as maps:
            paths = {
                path
                for line in maps
                if (path := line.rsplit(None, 1)[-1]).rsplit("/", 1)[-1].startswith("libpq")
            }
        return _LibPq(paths.pop()) if len(paths) == 1 else None
    except (OSError, AttributeError):
        return None


class Unencodable(TypeError):
    """A parameter this module does not send (the caller uses psycopg for it)."""


def text_array(items: Sequence[Any]) -> bytes:
    """``text[]`` in PostgreSQL's binary format: items ``str``, ``int`` (as decimal
    text, for statements that cast the array to NUMERIC) or None."""
    if not items:
        return _EMPTY_TEXT_ARRAY
    parts: list[bytes] = [b""]
    nulls = 0
    for item in items:
        if item is None:
            parts.append(_NULL_ITEM)
            nulls = 1
            continue
        if item.__class__ is str:
            data = item.encode()
        elif item.__class__ is int:
            data = str(item).encode()
        else:  # a bool is an int: it must not pass as 0 or 1, nor as "True"
            raise Unencodable(f"a text[] item must be str, int or None, not {item!r}")
        parts += (_ITEM_LEN(len(data)), data)
    parts[0] = _ARRAY_HEAD(1, nulls, _TEXT, len(items), 1)
    return b"".join(parts)


def _bool_array(items: Sequence[Any]) -> bytes:
    parts = [_ARRAY_HEAD(1, int(None in items), _BOOL, len(items), 1)]
    for item in items:
        if item is None:
            parts.append(_NULL_ITEM)
        elif item is True or item is False:
            parts.append(_TRUE_ITEM if item else _FALSE_ITEM)
        else:
            raise Unencodable(f"a bool[] item must be bool or None, not {item!r}")
    return b"".join(parts)


def encode(value: Any, kind: str) -> tuple[bytes | None, int, int]:
    """One parameter as (data, type oid, format: 0 text, 1 binary); ``kind`` is its
    placeholder's letter (``b`` asks for a typed ``text``, as psycopg's binary str)."""
    if value is None:
        return None, _UNKNOWN, 0
    cls = value.__class__
    if cls is str:
        return value.encode(), _TEXT if kind == "b" else _UNKNOWN, 0
    if cls is bool:
        return (b"t" if value else b"f"), _BOOL, 0
    if cls is int:
        oid = _INT8 if _INT8_MIN <= value <= _INT8_MAX else _NUMERIC
        return str(value).encode(), oid, 0
    if cls is bytes:
        return value, _BYTEA, 1
    if isinstance(value, list):
        if (
            cls is list  # a TextArray (a list subclass) is text[] whatever it holds
            and all(v is None or v.__class__ is bool for v in value)
            and any(v is not None for v in value)
        ):
            return _bool_array(value), _BOOL_ARRAY, 1
        return text_array(value), TEXT_ARRAY_OID, 1
    raise Unencodable(f"no wire encoding for {cls.__name__}")


class _Parsed:
    """A statement text with psycopg's placeholders, converted once."""

    __slots__ = ("kinds", "names", "query")

    def __init__(self, sql: str) -> None:
        names: list[int | str] = []
        kinds: list[str] = []
        index: dict[str, int] = {}
        position = 0

        def swap(m: re.Match[str]) -> str:
            nonlocal position
            name, kind = m.group(1), m.group(2)
            if kind == "%":
                return "%"
            if name is None:
                names.append(position)
                kinds.append(kind)
                position += 1
                return f"${len(names)}"
            if name not in index:
                names.append(name)
                kinds.append(kind)
                index[name] = len(names)
            return f"${index[name]}"

        self.query = _PLACEHOLDER.sub(swap, sql).encode()
        if position and index:
            raise ValueError("a statement mixes positional and named placeholders")
        self.names: tuple[int | str, ...] = tuple(names)
        self.kinds: tuple[str, ...] = tuple(kinds)


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
        self.parsed: dict[str, _Parsed] = {}
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
    ) -> tuple[_Parsed, list[bytes | None], tuple[int, ...], list[int]]:
        parsed = self.parsed.get(sql)
        if parsed is None:
            parsed = self.parsed[sql] = _Parsed(sql)
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
        begin = not self.conn.autocommit and pg.transaction_status == _IDLE
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

    def _sender(self) -> _Sender:
        lib = _libpq()
        return _Sender(self.pg) if lib is None else _HeldSender(self.pg, lib)

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


class _Sender:
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


class _HeldSender(_Sender):
    """Sends them with libpq's functions called holding the GIL (:class:`_LibPq`)."""

    def __init__(self, pg: pq.abc.PGconn, lib: _LibPq) -> None:
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
            array("Q", [0 if v is None else id(v) + _BYTES_DATA for v in values]),
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
        if (
            self.wire.after_begin
            and not conn.autocommit
            and conn.pgconn.transaction_status == _IDLE
        ):
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
