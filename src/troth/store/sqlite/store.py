"""The SQLite store: one database file in WAL mode, behind :class:`Store` group commit.

It answers exactly as the memory store does (scans in id order with ``after``
exclusive, due lists in ``(deadline, id)`` order, the same snapshot); its queries
are in ``queries.sql``, its rows are ``store/codec.py``'s, its outbox rules
``store/outbox.py``'s.  What is SQLite's own: integers beyond 64 bits stored as
BLOBs, ``BEGIN IMMEDIATE`` batches on one connection, savepoints per job.  The
reasons are in ``docs/architecture.md`` ("SQLite").
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final, Protocol, TypeVar, cast

from troth.flow.limits import Held, Limit, held_row, limit_row, stored_limit
from troth.outbox import codes
from troth.outbox.rows import OutboxRow
from troth.protocol.records import PENDING, TAG_ORIGIN, Promise, Schedule, Tags, Task
from troth.store.base import Backend, BeginWouldWait, Job, Outcome, ReadOnly, Store, read_only
from troth.store.codec import PROMISE_COLS, SCHEDULE_COLS, TASK_COLS, RowCodec
from troth.store.faults import Reason, StoreFault, StoreUnavailable
from troth.store.inspection import Inspection, SqlInspection
from troth.store.migrate import check_version, migrate
from troth.store.outbox import OutboxStore, OutboxTable, SqlOutboxTable
from troth.store.queries import load_queries
from troth.store.retention import Retention, SqlRetention
from troth.store.sqlite.inline import InlineReader, map_header
from troth.store.sqlite.migrate import SqliteSchema
from troth.store.writes import Writes

__all__ = ["CODEC", "SqliteBackend", "SqliteOutbox", "SqliteStore"]

T = TypeVar("T")

#: Milliseconds the writer's connection waits for another process's write lock.
BUSY_MS: Final = 5000
#: SQLite's primary result codes that say the store refuses writes (``refused``).
_FAULTS: Final[dict[int, Reason]] = {
    13: "disk_full",  # SQLITE_FULL
    8: "read_only",  # SQLITE_READONLY
    3: "read_only",  # SQLITE_PERM
    10: "unavailable",  # SQLITE_IOERR
    14: "unavailable",  # SQLITE_CANTOPEN
}
#: Bytes a probe wants free beside the file before it says the store takes writes.
PROBE_ROOM: Final = 1 << 20
#: The write ``probe`` commits: the newest schema_version row, unchanged.
_PROBE: Final = (
    "UPDATE schema_version SET applied_at = applied_at"
    " WHERE version = (SELECT max(version) FROM schema_version)"
)

# -- integers ---------------------------------------------------------------------------

_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1


def _int_in(n: int | None) -> int | bytes | None:
    """An integer as SQLite can store it: beyond 64 bits a BLOB that sorts after every
    INTEGER and, among BLOBs, numerically (docs/architecture.md, "SQLite")."""
    if n is None or _I64_MIN <= n <= _I64_MAX:
        return n
    if n < 0:
        raise OverflowError(f"integer {n} is below -2**63 and cannot be stored")
    size = (n.bit_length() + 7) // 8
    return size.to_bytes(4, "big") + n.to_bytes(size, "big")


def _int_out(v: Any) -> Any:
    """Inverse of :func:`_int_in` (``int``, ``None``, or a BLOB-encoded big int)."""
    if v.__class__ is bytes:
        size = int.from_bytes(v[:4], "big")
        return int.from_bytes(v[4 : 4 + size], "big")
    return v


_Q: Final = load_queries("troth.store.sqlite")
_CODEC: Final = RowCodec(int_in=_int_in, int_out=_int_out, flag=int)
#: The same codec by a public name, for what reads a file outside the store (transfer.py).
CODEC: Final = _CODEC
_TABLES: Final = (
    "promises",
    "tasks",
    "schedules",
    "outbox",
    "flow_limits",
    "flow_slots",
    "flow_held",
)
_SAVEPOINT: Final = "troth_job"


def _tag_filter(table: str, column: str) -> str:
    """One ``key = value`` pair of a tag filter.

    ``json_each`` compares the decoded key, so any key works (``resonate:origin``,
    keys with quotes or dots), which a ``json_extract`` path cannot promise.
    """
    return f"EXISTS (SELECT 1 FROM json_each({table}.{column}) WHERE key = ? AND value = ?)"


def _scan_sql(
    table: str,
    columns: str,
    states: int | None,
    tags_column: str | None,
    tags: int,
    after: bool,
    origin: bool = False,
    pending: bool = False,
) -> str:
    """The scan's statement; with ``origin``, the first condition is the indexed
    ``origin = ?`` (the ``resonate:origin`` tag, derived on every write); ``pending``
    (the states are exactly pending) is a literal, which the partial index of pending
    promises matches (the planner cannot see through a bound parameter)."""
    where: list[str] = ["origin = ?"] if origin else []
    if after:
        where.append("id > ?")
    if pending:
        where.append("state = 'pending'")
    elif states is not None:
        where.append(f"state IN ({', '.join('?' * states)})")
    if tags_column is not None:
        where.extend(_tag_filter(table, tags_column) for _ in range(tags))
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {columns} FROM {table}{clause} ORDER BY id LIMIT ?"


def _scan_params(
    after: str | None, states: Collection[str] | None, tags: Tags, limit: int
) -> list[Any]:
    params: list[Any] = []
    if after is not None:
        params.append(after)
    if states is not None:
        params.extend(states)
    for k, v in tags.items():
        params.extend((k, v))
    params.append(limit)
    return params


# -- the backend -----------------------------------------------------------------------------


class Executes(Protocol):
    """What :class:`SqliteBackend` uses of its connection."""

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor: ...


def _settles(old: Promise, new: Promise) -> bool:
    """Whether ``new`` differs from ``old`` (the row as it stands) at most in state,
    value and settled_at.  The other fields are compared by identity: a settle keeps
    the old row's objects (``msgspec.structs.replace``); anything else takes the
    full write, which is never wrong."""
    return (
        old.param is new.param
        and old.tags is new.tags
        and old.callbacks is new.callbacks
        and old.listeners is new.listeners
        and old.timeout_at == new.timeout_at
        and old.created_at == new.created_at
    )


class SqliteBackend(Backend):
    """Reads and writes of the transaction that :meth:`SqliteStore.begin` opened.

    The writer's backend (``known`` not None) keeps the promise rows the transaction
    read or wrote, as they stand in it: a write that only settles one of them
    (:func:`_settles`) updates the four columns a settle changes instead of
    rewriting all fourteen (a third less SQLite time, and no JSON for the others).
    ``known`` is emptied when a transaction begins."""

    def __init__(self, conn: Executes, *, known: bool = False) -> None:
        self.conn = conn
        self.known: dict[str, Promise] | None = {} if known else None

    # -- reads ------------------------------------------------------------------------

    def get_promise(self, id: str) -> Promise | None:
        r = self.conn.execute(_Q["get_promise"], (id,)).fetchone()
        if r is None:
            return None
        p = _CODEC.promise(r)
        if self.known is not None:
            self.known[id] = p
        return p

    def get_task(self, id: str) -> Task | None:
        r = self.conn.execute(_Q["get_task"], (id,)).fetchone()
        return None if r is None else _CODEC.task(r)

    def get_schedule(self, id: str) -> Schedule | None:
        r = self.conn.execute(_Q["get_schedule"], (id,)).fetchone()
        return None if r is None else _CODEC.schedule(r)

    def get_trace(self, id: str) -> str | None:
        r = self.conn.execute(_Q["get_trace"], (id,)).fetchone()
        return None if r is None else cast(str | None, r[0])

    def scan_promises(
        self, states: Collection[str] | None, tags: Tags, after: str | None, limit: int
    ) -> list[Promise]:
        if states is not None and not states:
            return []
        origin = tags.get(TAG_ORIGIN)
        if origin is not None:
            tags = {k: v for k, v in tags.items() if k != TAG_ORIGIN}
        pending = states is not None and set(states) == {PENDING}
        if pending:
            states = None
        sql = _scan_sql(
            "promises",
            PROMISE_COLS,
            None if states is None else len(states),
            "tags",
            len(tags),
            after is not None,
            origin is not None,
            pending,
        )
        params = _scan_params(after, states, tags, limit)
        if origin is not None:
            params.insert(0, origin)
        rows = self.conn.execute(sql, params).fetchall()
        return [_CODEC.promise(r) for r in rows]

    def scan_tasks(
        self, states: Collection[str] | None, after: str | None, limit: int
    ) -> list[Task]:
        if states is not None and not states:
            return []
        sql = _scan_sql(
            "tasks", TASK_COLS, None if states is None else len(states), None, 0, after is not None
        )
        rows = self.conn.execute(sql, _scan_params(after, states, {}, limit)).fetchall()
        return [_CODEC.task(r) for r in rows]

    def scan_schedules(self, tags: Tags, after: str | None, limit: int) -> list[Schedule]:
        sql = _scan_sql(
            "schedules", SCHEDULE_COLS, None, "promise_tags", len(tags), after is not None
        )
        rows = self.conn.execute(sql, _scan_params(after, None, tags, limit)).fetchall()
        return [_CODEC.schedule(r) for r in rows]

    def promises_in_branch(self, branch: str, limit: int) -> list[Promise]:
        if not branch:
            return []  # the empty branch is never indexed (memory.py: ``if branch:``)
        rows = self.conn.execute(_Q["promises_in_branch"], (branch, limit)).fetchall()
        return [_CODEC.promise(r) for r in rows]

    # -- deadlines ----------------------------------------------------------------------

    def _ids(self, sql: str, params: tuple[Any, ...]) -> list[str]:
        return [r[0] for r in self.conn.execute(sql, params)]

    def due_promises(self, now: int, limit: int) -> list[str]:
        return self._ids(_Q["due_promises"], (_int_in(now), limit))

    def due_tasks(self, now: int, limit: int) -> list[str]:
        return self._ids(_Q["due_tasks"], (_int_in(now), limit))

    def due_schedules(self, now: int, limit: int) -> list[str]:
        return self._ids(_Q["due_schedules"], (_int_in(now), limit))

    def undrained_promises(self, limit: int) -> list[str]:
        return self._ids(_Q["undrained_promises"], (limit,))

    def next_deadline(self) -> int | None:
        undrained, *armed = self.conn.execute(_Q["next_deadline"]).fetchone()
        candidates: list[int] = [_int_out(d) for d in armed if d is not None]
        if undrained:
            candidates.append(0)
        return min(candidates) if candidates else None

    # -- writes -------------------------------------------------------------------------

    # -- flow control ---------------------------------------------------------------

    def flow_limits(self) -> list[Limit]:
        rows = self.conn.execute(_Q["flow_limits"]).fetchall()
        return [stored_limit(*row) for row in rows]

    def flow_tat(self, group: str) -> float:
        r = self.conn.execute(_Q["flow_tat"], (group,)).fetchone()
        return 0.0 if r is None else float(r[0])

    def flow_slot(self, task_id: str) -> str | None:
        r = self.conn.execute(_Q["flow_slot"], (task_id,)).fetchone()
        return None if r is None else str(r[0])

    def flow_in_use(self, group: str) -> int:
        return int(self.conn.execute(_Q["flow_in_use"], (group,)).fetchone()[0])

    def flow_slots_of(self, group: str) -> list[str]:
        rows = self.conn.execute(_Q["flow_slots_of"], (group,)).fetchall()
        return [str(r[0]) for r in rows]

    def flow_held(self, group: str, limit: int, offset: int = 0) -> list[Held]:
        rows = self.conn.execute(_Q["flow_held"], (group, limit, offset)).fetchall()
        return [Held(*row) for row in rows]

    def flow_queued(self, task_id: str) -> Held | None:
        r = self.conn.execute(_Q["flow_queued"], (task_id,)).fetchone()
        return None if r is None else Held(*r)

    def flow_key_in_use(self, group: str, key: str) -> int:
        return int(self.conn.execute(_Q["flow_key_in_use"], (group, key)).fetchone()[0])

    def flow_key_turn(self, group: str, key: str) -> int:
        r = self.conn.execute(_Q["flow_key_turn"], (group, key)).fetchone()
        return 0 if r is None or r[0] is None else int(r[0])

    def flow_turn(self, group: str) -> int:
        r = self.conn.execute(_Q["flow_turn"], (group,)).fetchone()
        return 0 if r is None else int(r[0])

    def flow_held_count(self, group: str) -> int:
        return int(self.conn.execute(_Q["flow_held_count"], (group,)).fetchone()[0])

    def _apply_flow(self, writes: Writes, now: int) -> None:
        execute = self.conn.execute
        for key in writes.withdrawn or ():
            execute(_Q["delete_pending_message"], (key,))
        keys = writes.slot_keys or {}
        for task_id, group in (writes.slots or {}).items():
            if group is None:
                execute(_Q["flow_delete_slot"], (task_id,))
            else:
                execute(_Q["flow_put_slot"], (task_id, group, keys.get(task_id, "")))
        for task_id, held in (writes.held or {}).items():
            if held is None:
                execute(_Q["flow_delete_held"], (task_id,))
            else:
                execute(_Q["flow_put_held"], held_row(held))
        for group, limit in (writes.limits or {}).items():
            if limit is None:
                execute(_Q["flow_delete_limit"], (group,))
                execute(_Q["flow_delete_group_slots"], (group,))
            else:
                execute(_Q["flow_put_limit"], limit_row(limit, now))
        for group, tat in (writes.tats or {}).items():
            execute(_Q["flow_put_tat"], (tat, group))
        for group, turn in (writes.turns or {}).items():
            execute(_Q["flow_put_turn"], (turn, group))

    def apply(self, writes: Writes, now: int) -> None:
        execute = self.conn.execute
        known = self.known
        for p in writes.promises.values():
            if known is not None:
                old = known.get(p.id)
                known[p.id] = p
                if old is not None and _settles(old, p):
                    execute(_Q["settle_promise"], _CODEC.settle_row(p))
                    continue
            execute(_Q["upsert_promise"], _CODEC.promise_row(p))
        if writes.traces:
            for id, trace in writes.traces.items():
                execute(_Q["set_trace"], (trace, id))
        for t in writes.tasks.values():
            execute(_Q["upsert_task"], _CODEC.task_row(t))
        for id, s in writes.schedules.items():
            if s is None:
                execute(_Q["delete_schedule"], (id,))
            else:
                execute(_Q["upsert_schedule"], _CODEC.schedule_row(s))
        held = writes.available_at
        for key, entry in writes.messages.items():
            execute(_Q["delete_pending_message"], (key,))
            row = _CODEC.message_row(key, entry, now, held.get(key) if held else None)
            execute(_Q["insert_message"], row)
        if writes.has_flow():
            self._apply_flow(writes, now)

    # -- whole-store reads -----------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything, in memory.py's ``snapshot()`` format (built from the same Structs)."""
        return _CODEC.snapshot(lambda sql: self.conn.execute(sql).fetchall())


# -- the store ---------------------------------------------------------------------------------


class SqliteStore(Store):
    """A SQLite database file (or ``":memory:"``) with group commit.

    ``synchronous="full"`` fsyncs the WAL at every commit, so an acknowledged batch
    survives a power loss; ``"normal"`` may lose the last batches on power loss (never
    on a process crash) and is faster.  Group commit makes ``full`` affordable.
    """

    name = "sqlite"

    def __init__(self, path: str | os.PathLike[str], synchronous: str = "full") -> None:
        super().__init__()
        mode = synchronous.lower() if isinstance(synchronous, str) else None
        if mode not in ("full", "normal"):
            raise ValueError(f"synchronous must be 'full' or 'normal', got {synchronous!r}")
        self.path = os.fspath(path)
        self.synchronous = mode
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
            # Refuse a newer schema before anything (even the journal mode) is changed.
            if check_version(SqliteSchema(conn)) == 0:
                # A new file: deleted rows' pages can be given back (retention, reclaim);
                # only settable before the first table exists.
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            if self.path not in (":memory:", ""):
                conn.execute("PRAGMA journal_mode = WAL").fetchone()
            conn.execute(f"PRAGMA synchronous = {mode.upper()}")
            migrate(SqliteSchema(conn))
        except BaseException:
            conn.close()
            raise
        self.conn = conn
        self.backend = SqliteBackend(conn, known=True)
        self.outbox = SqliteOutbox(self)
        self._reader: sqlite3.Connection | None = None
        self._reader_lock = threading.Lock()
        #: The event loop's reader (``read_inline``), opened on first use.
        self._inline: InlineReader | None = None
        #: Whether a write transaction is open on :attr:`conn` (from ``BEGIN
        #: IMMEDIATE`` until its COMMIT or ROLLBACK returned, whichever thread runs
        #: it): the event loop's reader holds no snapshot across one.  Not
        #: ``conn.in_transaction``: SQLite ends that as a COMMIT starts, and the
        #: COMMIT's checkpoint, which a held snapshot would stop short, runs after.
        self.writing = False
        #: The reader threads' connections (``read_many``), one per thread, by thread id.
        self._pooled: dict[int, sqlite3.Connection] = {}
        self._pooled_lock = threading.Lock()
        self.inline_reads = self.pooled_reads = self.path not in (":memory:", "")
        #: A failed apply rolls the batch back and re-runs it (Store.savepoints).
        self.savepoints = False
        self.loop_batches = True

    # -- transactions --------------------------------------------------------------------

    def begin(self) -> Backend:
        if self.conn.in_transaction:
            # Only reachable if a previous batch died between begin and commit/rollback;
            # nothing of it was acknowledged, so dropping it is the right thing.
            self.conn.execute("ROLLBACK")
        self.writing = True
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.writing = False
            raise
        assert self.backend.known is not None
        self.backend.known.clear()
        return self.backend

    def begin_nowait(self) -> Backend:
        """On the event loop: another process holding the file's write lock must not
        stall it for ``busy_timeout``; the batch goes to the writer thread instead."""
        if self._inline is not None:
            self._inline.release()  # a WAL restarts only where no reader holds a mark
        self.conn.execute("PRAGMA busy_timeout = 0")
        try:
            return self.begin()
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                raise BeginWouldWait(str(exc)) from exc
            raise
        finally:
            self.conn.execute(f"PRAGMA busy_timeout = {BUSY_MS}")

    def commit(self) -> None:
        try:
            self.conn.execute("COMMIT")
        finally:
            self.writing = self.conn.in_transaction

    def rollback(self) -> None:
        """Best effort: never raises, so the error that caused it is what callers see.

        A failed COMMIT may already have ended the transaction, and on a closed or
        broken connection there is nothing to roll back (SQLite discards an unfinished
        transaction when the connection goes; :meth:`begin` drops a leftover one).
        """
        try:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        self.writing = False

    def savepoint(self) -> None:
        self.conn.execute(f"SAVEPOINT {_SAVEPOINT}")

    def release(self) -> None:
        self.conn.execute(f"RELEASE {_SAVEPOINT}")

    def rollback_to(self) -> None:
        # ROLLBACK TO keeps the savepoint open; release it so the next job's SAVEPOINT
        # is not nested inside this one.
        self.conn.execute(f"ROLLBACK TO {_SAVEPOINT}")
        self.conn.execute(f"RELEASE {_SAVEPOINT}")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction outside group commit (reset, the outbox lifecycle)."""
        with self.lock:
            self.begin()
            try:
                yield self.conn
                self.commit()
            except BaseException:
                self.rollback()
                raise

    # -- whole-store operations -------------------------------------------------------------

    def reset(self) -> None:
        """Delete every row, and restart outbox ids at 1 as a fresh memory store does."""
        with self.transaction() as conn:
            for table in _TABLES:
                conn.execute(f"DELETE FROM {table}")
            conn.execute("DELETE FROM sqlite_sequence WHERE name = 'outbox'")

    def flow_load(self) -> list[Limit]:
        """One statement in autocommit: no BEGIN, no COMMIT."""
        with self.lock:
            return self.backend.flow_limits()

    def snapshot(self) -> dict[str, Any]:
        """Read in one (read) transaction, so the four lists are mutually consistent."""
        with self.lock:
            self.conn.execute("BEGIN")
            try:
                return self.backend.snapshot()
            finally:
                self.rollback()

    def ping(self) -> None:
        # Bounded wait: a wedged batch must make /ready fail, not hang it.
        if not self.lock.acquire(timeout=5):
            raise StoreUnavailable("sqlite store is busy (lock not acquired within 5 s)")
        try:
            self.conn.execute("SELECT 1").fetchone()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"sqlite store unavailable: {exc}") from exc
        finally:
            self.lock.release()

    def refused(self, exc: BaseException) -> StoreFault | None:
        """SQLite's own: a full disk (``SQLITE_FULL``), a file or directory it may not
        write (``SQLITE_READONLY``, ``SQLITE_PERM``), a file it cannot read or write
        any more (``SQLITE_IOERR``, ``SQLITE_CANTOPEN``)."""
        if isinstance(exc, sqlite3.Error):
            reason = _FAULTS.get(getattr(exc, "sqlite_errorcode", 0) & 0xFF)
            return None if reason is None else StoreFault(reason, str(exc))
        return super().refused(exc)

    def probe(self) -> None:
        """At least :data:`PROBE_ROOM` bytes free beside the file, then one write
        transaction that rewrites the newest ``schema_version`` row as it is: a page
        written to the WAL and its fsync, as a batch's COMMIT does.  (The page alone
        may fit where a request's rows do not: a disk that refused a request stays
        "full" until there is room for more than a page.)"""
        if self.path not in (":memory:", ""):
            where = os.path.dirname(os.path.realpath(self.path))
            disk = os.statvfs(where)
            room = disk.f_bavail * disk.f_frsize
            if room < PROBE_ROOM:
                raise StoreFault("disk_full", f"{room} bytes free in {where}")
        with self.transaction() as conn:
            conn.execute(_PROBE)

    def recovered(self) -> None:
        """Give back the WAL that grew while commits could not be checkpointed into a
        full disk: a ``TRUNCATE`` checkpoint copies it into the file and empties it
        (it waits for readers at most ``busy_timeout``; if one holds it up, the WAL is
        reused from its start by the next checkpoints anyway)."""
        with self.lock:
            if self.path in (":memory:", ""):
                return
            try:
                self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except sqlite3.Error:
                pass  # the next automatic checkpoint does the copying

    def read_inline(self, fn: Callable[[ReadOnly], T]) -> T:
        """On the event loop's own reader connection (a point read takes a few µs: less
        than the two thread hops to the writer and back), inside the snapshot it holds
        while nothing is committed (``store/sqlite/inline.py``).  WAL: it sees every
        commit made before it began and never waits for the writer; ``busy_timeout``
        is 0 so that the rare moment it would wait (WAL recovery) fails over to the
        writer instead of blocking the loop."""
        reader = self._inline
        if reader is None:
            reader = self._inline = self._open_inline()
        return reader.read(fn)

    def _open_inline(self) -> InlineReader:
        conn = self._open_reader(busy_ms=0)
        try:
            conn.execute("SELECT 1 FROM sqlite_schema LIMIT 1").fetchall()  # maps the -shm
        except sqlite3.OperationalError as exc:
            conn.close()
            raise StoreUnavailable(f"sqlite reader busy: {exc}") from exc
        # SQLite keeps the -shm beside the file a symbolic link names.
        header = map_header(os.path.realpath(self.path))
        return InlineReader(conn, SqliteBackend(conn.cursor()), header, self)

    def read_many(self, jobs: Sequence[Job[Any]]) -> list[Outcome[Any]]:
        """On the calling reader thread's own connection (searches: they may step
        through many rows, and SQLite lets go of the GIL while it steps), in one read
        transaction.  It may wait a little where the inline reader would not: it is not
        on the event loop."""
        ident = threading.get_ident()
        conn = self._pooled.get(ident)
        if conn is None:
            conn = self._open_reader(busy_ms=1000)
            with self._pooled_lock:
                self._pooled[ident] = conn
        return self._read_on(conn, jobs)

    def _open_reader(self, *, busy_ms: int) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
        conn.execute("PRAGMA query_only = 1")
        return conn

    @staticmethod
    def _read_on(conn: sqlite3.Connection, jobs: Sequence[Job[Any]]) -> list[Outcome[Any]]:
        """``jobs`` in one read transaction of ``conn`` (one snapshot of the file)."""
        try:
            conn.execute("BEGIN")
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"sqlite reader busy: {exc}") from exc
        try:
            backend = SqliteBackend(conn)
            return [read_only(backend, job.fn, (sqlite3.OperationalError,)) for job in jobs]
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"sqlite reader busy: {exc}") from exc
        finally:
            conn.execute("ROLLBACK")

    def inspect(self, fn: Callable[[Inspection], T]) -> T:
        """On a reader connection of its own (WAL: it sees the last commit and never
        waits for, nor holds up, the writer); an in-memory database has one
        connection only, taken under the writer's lock."""
        if self.path in (":memory:", ""):
            with self.lock:
                return self._inspect(self.conn, fn)
        with self._reader_lock:
            if self._reader is None:
                self._reader = self._open_reader(busy_ms=5000)
            return self._inspect(self._reader, fn)

    @staticmethod
    def _inspect(conn: sqlite3.Connection, fn: Callable[[Inspection], T]) -> T:
        conn.execute("BEGIN")
        try:
            return fn(SqlInspection(conn.cursor(), _CODEC, "?"))
        finally:
            conn.execute("ROLLBACK")

    def retain(self, fn: Callable[[Retention], T]) -> T:
        """A retention batch, committed without an fsync of its own: deleting is
        idempotent (a batch lost in a crash is found again by the next pass), and the
        next request commit's fsync makes it durable along with itself (the WAL is
        written in order).  A batch then costs the writer no fsync beside the
        requests'."""
        with self.lock:
            relax = self.synchronous == "full"
            if relax:
                self.conn.execute("PRAGMA synchronous = NORMAL")
            try:
                self.begin()
                try:
                    result = fn(SqlRetention(self.conn.cursor(), _CODEC, "?"))
                    self.commit()
                except BaseException:
                    self.rollback()
                    raise
                return result
            finally:
                if relax:
                    self.conn.execute("PRAGMA synchronous = FULL")

    def reclaim(self, pages: int) -> int:
        """Give up to ``pages`` free pages back to the file system (a file created
        with ``auto_vacuum = INCREMENTAL``; an older file reuses its free pages for
        new rows instead, so it stops growing without shrinking); free pages left."""
        with self.lock:
            if self.conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:
                # executescript steps the pragma to the end; execute() frees one page
                # per step.  Outside a transaction, so it commits nothing of others'.
                self.conn.executescript(f"PRAGMA incremental_vacuum({int(pages)});")
            free: int = self.conn.execute("PRAGMA freelist_count").fetchone()[0]
            return free

    def close(self) -> None:
        if self._inline is not None:
            self._inline.close()
            self._inline = None
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        with self._pooled_lock:
            for conn in self._pooled.values():
                conn.close()
            self._pooled.clear()
        with self.lock:
            self.conn.close()

    def schema_version(self) -> int:
        """The stored schema version (for diagnostics and tests)."""
        with self.lock:
            return check_version(SqliteSchema(self.conn))


class SqliteOutbox(OutboxStore):
    """The outbox-row lifecycle (``store/outbox.py``) over the outbox table: each call
    one ``BEGIN IMMEDIATE`` transaction, so a claim is atomic even with other
    processes on the same file."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    def write(self, fn: Callable[[OutboxTable], T]) -> T:
        with self.store.transaction() as conn:
            return fn(SqliteOutboxTable(conn, _Q, _CODEC))

    def read(self, fn: Callable[[OutboxTable], T]) -> T:
        with self.store.lock:
            return fn(SqliteOutboxTable(self.store.conn, _Q, _CODEC))


class SqliteOutboxTable(SqlOutboxTable):
    """The shared SQL outbox table, with SQLite's claim (``UPDATE … RETURNING``)."""

    def claim(self, worker_id: str, now: int, limit: int, token: str) -> list[OutboxRow]:
        at = _int_in(now)
        claimed = self.cur.execute(_Q["claim"], (token, worker_id, at, at, at, limit)).fetchall()
        return [_CODEC.outbox_row(r) for r in claimed]

    def stranded(self, now: int, since: int) -> list[tuple[int, str, str, str, int]]:
        found = self.cur.execute(
            _Q["stranded"],
            (_int_in(now), codes.NO_CONNECTION, _int_in(since), codes.ATTEMPTS_EXHAUSTED),
        ).fetchall()
        return [(r[0], r[1], r[2], r[3], _CODEC.int_out(r[4])) for r in found]
