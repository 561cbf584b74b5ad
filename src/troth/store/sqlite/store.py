"""The SQLite store: one database file in WAL mode, behind :class:`Store` group commit.

It answers exactly as the memory store does (scans in id order with ``after``
exclusive, due lists in ``(deadline, id)`` order, the same snapshot); its queries
are in ``queries.sql``, its rows are ``store/sql/codec.py``'s, its outbox rules
``store/outbox.py``'s.  What is SQLite's own: integers beyond 64 bits stored as
BLOBs, ``BEGIN IMMEDIATE`` batches on one connection, savepoints per job.  The
reasons are in ``docs/architecture.md`` ("SQLite").
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final, TypeVar

from troth.flow.limits import Limit
from troth.outbox import codes
from troth.outbox.rows import OutboxRow
from troth.store.base import Backend, BeginWouldWait, Job, Outcome, ReadOnly, Store, read_only
from troth.store.faults import Reason, StoreFault, StoreUnavailable
from troth.store.inspection import Inspection, SqlInspection
from troth.store.outbox import OutboxStore, OutboxTable, SqlOutboxTable
from troth.store.retention import Retention, SqlRetention
from troth.store.sql.migrate import check_version, migrate
from troth.store.sqlite.backend import CODEC, Q, SqliteBackend, int_in
from troth.store.sqlite.inline import InlineReader, map_header
from troth.store.sqlite.migrate import SqliteSchema

__all__ = ["SqliteOutbox", "SqliteStore"]


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
TABLES: Final = (
    "promises",
    "tasks",
    "schedules",
    "outbox",
    "flow_limits",
    "flow_slots",
    "flow_held",
)
SAVEPOINT: Final = "troth_job"


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
        self.conn.execute(f"SAVEPOINT {SAVEPOINT}")

    def release(self) -> None:
        self.conn.execute(f"RELEASE {SAVEPOINT}")

    def rollback_to(self) -> None:
        # ROLLBACK TO keeps the savepoint open; release it so the next job's SAVEPOINT
        # is not nested inside this one.
        self.conn.execute(f"ROLLBACK TO {SAVEPOINT}")
        self.conn.execute(f"RELEASE {SAVEPOINT}")

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
            for table in TABLES:
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
            return fn(SqlInspection(conn.cursor(), CODEC, "?"))
        finally:
            conn.execute("ROLLBACK")

    def retain(self, fn: Callable[[Retention], T]) -> T:
        """A retention batch, committed without an fsync of its own: deleting is
        idempotent (a batch lost in a crash is found again by the next pass), and the
        next request commit's fsync makes it durable along with itself (the WAL is
        written in order).  A batch then costs the writer no fsync beside the
        requests'."""
        with self.lock, self._relaxed():
            self.begin()
            try:
                result = fn(SqlRetention(self.conn.cursor(), CODEC, "?"))
                self.commit()
            except BaseException:
                self.rollback()
                raise
            return result

    def retain_open(self, fn: Callable[[Retention], T]) -> T:
        """A retention batch in the request batch the event loop holds open: it commits
        with that batch, sharing its COMMIT (the WAL writes and fsync, on the writer
        thread) rather than making one of its own on the event loop."""
        return fn(SqlRetention(self.conn.cursor(), CODEC, "?"))

    def reclaim(self, pages: int, spare: float = 0.0) -> int:
        """Give up to ``pages`` free pages back to the file system (a file created
        with ``auto_vacuum = INCREMENTAL``; an older file reuses its free pages for
        new rows instead, so it stops growing without shrinking), in a transaction
        committed without an fsync of its own, as :meth:`retain` (pages not given
        back stay free)."""
        with self.lock, self._relaxed():
            self.begin()
            try:
                left = self._vacuum(pages, spare)
                self.commit()
            except BaseException:
                self.rollback()
                raise
            return left

    def reclaim_open(self, pages: int, spare: float = 0.0) -> int:
        return self._vacuum(pages, spare)

    def _vacuum(self, pages: int, spare: float) -> int:
        """Move up to ``pages`` pages from the end of the file into free ones, keeping
        ``spare`` of the file's pages free: rows written meanwhile reuse those rather
        than grow the file again (a steady load deletes and writes about as many
        pages between two passes; giving them back each pass would only move pages
        to and fro).  The free pages left beyond the spare ones."""
        conn = self.conn
        if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
            return 0
        count: int = conn.execute("PRAGMA page_count").fetchone()[0]
        free: int = conn.execute("PRAGMA freelist_count").fetchone()[0]
        keep = int(count * spare)
        give = max(0, min(pages, free - keep))
        for _ in range(give):
            # One page per statement: the pragma moves a page each step, and Python's
            # execute() steps a statement that returns no rows once.
            conn.execute("PRAGMA incremental_vacuum(1)")
        return max(0, free - give - keep)

    @contextmanager
    def _relaxed(self) -> Iterator[None]:
        """``synchronous = NORMAL`` for work that is idempotent (retention's): its
        commit writes the WAL without an fsync; the next request's makes it durable."""
        relax = self.synchronous == "full"
        if relax:
            self.conn.execute("PRAGMA synchronous = NORMAL")
        try:
            yield
        finally:
            if relax:
                self.conn.execute("PRAGMA synchronous = FULL")

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
            return fn(SqliteOutboxTable(conn, Q, CODEC))

    def read(self, fn: Callable[[OutboxTable], T]) -> T:
        with self.store.lock:
            return fn(SqliteOutboxTable(self.store.conn, Q, CODEC))


class SqliteOutboxTable(SqlOutboxTable):
    """The shared SQL outbox table, with SQLite's claim (``UPDATE … RETURNING``)."""

    def claim(self, worker_id: str, now: int, limit: int, token: str) -> list[OutboxRow]:
        at = int_in(now)
        claimed = self.cur.execute(Q["claim"], (token, worker_id, at, at, at, limit)).fetchall()
        return [CODEC.outbox_row(r) for r in claimed]

    def stranded(self, now: int, since: int) -> list[tuple[int, str, str, str, int]]:
        found = self.cur.execute(
            Q["stranded"],
            (int_in(now), codes.NO_CONNECTION, int_in(since), codes.ATTEMPTS_EXHAUSTED),
        ).fetchall()
        return [(r[0], r[1], r[2], r[3], CODEC.int_out(r[4])) for r in found]
