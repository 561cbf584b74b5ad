"""Moving a SQLite deployment to PostgreSQL (``troth migrate-store``), verified.

Every row of the four tables is copied as it is — pending and settled promises
with their callbacks and listeners, tasks in every state, schedules, outbox rows
with their id and delivery state — through the stores' own codecs: a row is read
into its record with the SQLite codec (which undoes the BLOB encoding of integers
beyond 64 bits) and written with exactly the columns the PostgreSQL store writes
for that record (``RowCodec.promise_row`` derives ``external``, ``branch``,
``undrained`` and ``origin``; an outbox row gets its parsed ``poll://``
destination, ``RowCodec.destination``), by the store's own multi-row inserts.
Deriving them again rather than copying them makes the target what a PostgreSQL
node would have written itself.  The trace context stored with promises (tracing
on: ``promises.trace``) is no part of a record; it is copied and compared as a table
of its own after them (:data:`TRACES`), so a moved workflow's later requests join
its trace.

The copy is one PostgreSQL transaction over one SQLite read transaction: the
target gets all of it or nothing, and it is the source as of one instant.  The
target must be empty (checked under a table lock, in that transaction), so a
second run or a wrong URL cannot mix two histories.  Outbox ids are kept (they
name deliveries in logs and decide delivery order) and the target's id sequence
is moved past the source's high-water mark, so no id is handed out twice.

Then the target is read back in id order, in batches, and compared with the
source row by row: every written column (derived ones included) against what the
codec makes of the source record, and the record decoded by the PostgreSQL codec
against the source record.  Nothing is held in memory but one batch per side.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any, Final

import psycopg

from troth.outbox.rows import OutboxRow
from troth.store.postgres.rows import CODEC, FLAGS_P, FLAGS_T, Q, columns
from troth.store.postgres.session import NUL, Conn, IntLoader, TextArray
from troth.store.postgres.store import PostgresStore
from troth.store.sql.codec import OUTBOX_COLS, PROMISE_COLS, SELECT_ALL
from troth.store.sql.migrate import SchemaError, latest_version
from troth.store.sql.queries import load_queries
from troth.store.sqlite.backend import CODEC as SQLITE
from troth.store.sqlite.backup import BackupError, connect_existing, troth_version
from troth.store.sqlite.migrate import SqliteSchema

Cur = psycopg.Cursor[tuple[Any, ...]]

#: Rows per statement (and per comparison step): large enough that a statement's
#: round trip is noise, small enough that a batch of big payloads stays in memory.
BATCH: Final = 5000

_T: Final = load_queries("troth.store.postgres", "transfer.sql")


class TransferError(RuntimeError):
    """The move was refused or failed; the target was left as it was (empty)."""


@dataclass(frozen=True)
class TransferReport:
    counts: dict[str, int]
    #: The first outbox id the target hands out next.
    next_outbox_id: int
    copy_seconds: float
    verify_seconds: float


@dataclass(frozen=True)
class _Table:
    """How one table is read from SQLite, written to PostgreSQL and compared."""

    name: str
    #: The source's rows in id order (SQLite).
    source_sql: str
    #: Source row → record (the SQLite codec).
    read: Callable[[Sequence[Any]], Any]
    #: Record → the target's columns as the PostgreSQL store writes them.
    row: Callable[[Any], tuple[Any, ...]]
    #: Target columns (as :attr:`row` lays them out) → record (the PostgreSQL codec).
    decode: Callable[[Sequence[Any]], Any]
    #: Writes a batch of :attr:`row` tuples.
    insert: Callable[[Cur, list[tuple[Any, ...]]], None]
    #: The target's rows in id order, every written column.
    target_sql: str


def _insert_promises(cur: Cur, rows: list[tuple[Any, ...]]) -> None:
    cur.execute(Q["insert_promises"], columns(rows, FLAGS_P))


def _insert_tasks(cur: Cur, rows: list[tuple[Any, ...]]) -> None:
    cur.execute(Q["insert_tasks"], columns(rows, FLAGS_T))


def _insert_schedules(cur: Cur, rows: list[tuple[Any, ...]]) -> None:
    cur.executemany(Q["insert_schedule"], rows)


def _insert_outbox(cur: Cur, rows: list[tuple[Any, ...]]) -> None:
    cur.execute(_T["insert_outbox_rows"], columns(rows))


def _insert_traces(cur: Cur, rows: list[tuple[Any, ...]]) -> None:
    cur.execute(Q["set_traces"], [TextArray(c) for c in zip(*rows, strict=True)])


def _outbox_row(keyed: tuple[str, OutboxRow]) -> tuple[Any, ...]:
    key, row = keyed
    return (key, *CODEC.outbox_columns(row), *CODEC.destination(row.entry.address))


_N_OUTBOX: Final = 1 + len(OUTBOX_COLS.split(", "))

TABLES: Final = (
    _Table(
        "promises",
        SELECT_ALL["promises"],
        SQLITE.promise,
        CODEC.promise_row,
        CODEC.promise,
        _insert_promises,
        f"SELECT {PROMISE_COLS}, external, branch, undrained, origin FROM promises ORDER BY id",
    ),
    _Table(
        "tasks",
        SELECT_ALL["tasks"],
        SQLITE.task,
        CODEC.task_row,
        CODEC.task,
        _insert_tasks,
        SELECT_ALL["tasks"],
    ),
    _Table(
        "schedules",
        SELECT_ALL["schedules"],
        SQLITE.schedule,
        CODEC.schedule_row,
        CODEC.schedule,
        _insert_schedules,
        SELECT_ALL["schedules"],
    ),
    _Table(
        "outbox",
        f"SELECT key, {OUTBOX_COLS} FROM outbox ORDER BY id",
        lambda r: (r[0], SQLITE.outbox_row(r[1:])),
        _outbox_row,
        lambda r: (r[0], CODEC.outbox_row(r[1:_N_OUTBOX])),
        _insert_outbox,
        f"SELECT key, {OUTBOX_COLS}, dest_cast, dest_group, dest_id FROM outbox ORDER BY id",
    ),
)

#: The trace contexts kept with promises (no part of a record): ``(id, trace)`` the
#: same on both sides, written after the promises by the store's ``set_traces``.
_TRACES: Final = "SELECT id, trace FROM promises WHERE trace IS NOT NULL ORDER BY id"
TRACES: Final = _Table("traces", _TRACES, tuple, tuple, tuple, _insert_traces, _TRACES)
#: What is copied and compared, in that order.
COPIED: Final = (*TABLES, TRACES)


def sqlite_to_postgres(
    sqlite_path: str,
    postgres_url: str,
    *,
    batch: int = BATCH,
    say: Callable[[str], None] = lambda _: None,
) -> TransferReport:
    """Copy the troth SQLite database at ``sqlite_path`` into the empty PostgreSQL
    database at ``postgres_url`` (its schema created or migrated first), then compare
    the two.  Run it with no server writing the source: what is written after the
    copy's snapshot is not moved.  Raises :class:`TransferError` with the reason."""
    if batch < 1:
        raise ValueError("batch must be >= 1")
    try:
        source = connect_existing(sqlite_path)
    except BackupError as exc:
        raise TransferError(str(exc)) from exc
    try:
        _check_source(source, sqlite_path)
        _prepare_target(postgres_url)
        try:
            conn: Conn = psycopg.connect(postgres_url, autocommit=False)
        except psycopg.Error as exc:
            raise TransferError(f"cannot connect to {_safe(postgres_url)}: {exc}") from exc
        with conn:
            conn.adapters.register_loader("numeric", IntLoader)
            source.execute("BEGIN")  # one snapshot of the source for the copy and the check
            try:
                started = time.monotonic()
                counts, next_id = _copy(source, conn, batch, say)
                copied = time.monotonic()
                _verify(source, conn, batch, say)
                checked = time.monotonic()
            finally:
                source.execute("ROLLBACK")
    except psycopg.Error as exc:
        raise TransferError(f"PostgreSQL: {exc}") from exc
    finally:
        source.close()
    return TransferReport(counts, next_id, copied - started, checked - copied)


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return "the PostgreSQL URL"
    return f"{info.get('host', 'localhost')}/{info.get('dbname', '')}"


def _check_source(source: sqlite3.Connection, path: str) -> None:
    """The source must be at this troth's schema version: the codecs read that layout,
    and a source is never written (not even migrated) by a move."""
    try:
        version = troth_version(source, path)
    except BackupError as exc:
        raise TransferError(str(exc)) from exc
    latest = latest_version(SqliteSchema(source))
    if version != latest:
        raise TransferError(
            f"{path} has schema version {version}, this troth writes {latest}: start this "
            "troth on it once (troth serve migrates it in place, then stop it) and run again"
        )


def _prepare_target(url: str) -> None:
    """Create or migrate the target's schema the way a node does when it starts."""
    try:
        PostgresStore(url).close()
    except SchemaError as exc:
        raise TransferError(f"target: {exc}") from exc
    except psycopg.Error as exc:
        raise TransferError(f"cannot open the target {_safe(url)}: {exc}") from exc


def _copy(
    source: sqlite3.Connection, conn: Conn, batch: int, say: Callable[[str], None]
) -> tuple[dict[str, int], int]:
    """Every table in one transaction, committed at the end; returns the counts and
    the next outbox id."""
    cur = conn.cursor()
    cur.execute("SET LOCAL lock_timeout = '10s'")
    cur.execute(_T["lock_tables"])
    found = cur.execute(_T["row_counts"]).fetchone()
    assert found is not None
    present = {t.name: int(n) for t, n in zip(TABLES, found, strict=True) if n}
    if present:
        held = ", ".join(f"{n} {name}" for name, n in present.items())
        raise TransferError(f"the target database is not empty ({held}); use an empty one")
    counts: dict[str, int] = {}
    for table in COPIED:
        n = 0
        rows = source.execute(table.source_sql)
        while chunk := rows.fetchmany(batch):
            out = [table.row(table.read(r)) for r in chunk]
            for r in out:
                if any(isinstance(v, str) and NUL in v for v in r):
                    raise TransferError(
                        f"{table.name} row {r[0]!r} holds U+0000, which PostgreSQL text cannot "
                        "store; nothing was moved"
                    )
            table.insert(cur, out)
            n += len(out)
        counts[table.name] = n
        say(f"copied {n} {table.name}")
    high = source.execute(
        "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'outbox'), 0), "
        "coalesce((SELECT max(id) FROM outbox), 0))"
    ).fetchone()[0]
    if high:
        cur.execute(_T["advance_outbox_ids"], (int(high),))
    conn.commit()
    return counts, int(high) + 1


def _verify(source: sqlite3.Connection, conn: Conn, batch: int, say: Callable[[str], None]) -> None:
    """Compare the target with the source row by row, in id order, in batches."""
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    for table in COPIED:
        expected = _stream(source.execute(table.source_sql), batch)
        with conn.cursor(name=f"troth_verify_{table.name}") as target:
            target.itersize = batch
            target.execute(table.target_sql)
            n = 0
            for src, got in zip_longest(expected, target):
                if src is None or got is None:
                    side = "target" if src is None else "source"
                    raise TransferError(f"{table.name}: the {side} has more rows than the other")
                record = table.read(src)
                want = table.row(record)
                if tuple(got) != want or table.decode(got) != record:
                    raise TransferError(
                        f"{table.name} row {want[0]!r} differs: source {want}, target {tuple(got)}"
                    )
                n += 1
        say(f"verified {n} {table.name}")
    conn.rollback()


def _stream(cursor: sqlite3.Cursor, batch: int) -> Iterator[Sequence[Any]]:
    while chunk := cursor.fetchmany(batch):
        yield from chunk
