"""The SQLite backend: one database file in WAL mode, behind :class:`Store` group commit.

It must answer exactly as :class:`~troth.store.memory.MemoryBackend` does (the
machine is tested against the memory backend; this one only adds durability), so
every query mirrors one of memory.py's: scans in id order with ``after``
exclusive, due lists in ``(deadline, id)`` order, the same ``snapshot()`` output.

Layout, and why:

* One row per object, the protocol Structs' JSON fields as ``msgspec`` JSON text.
  Columns that exist only to be searched (``external``, ``branch``, ``undrained``)
  are derived from the object on every write, so each timer or repair query is a
  range scan on a small partial index, never a walk over every promise.
* The outbox is written in the same transaction as the state change that caused a
  message, as a keyed upsert of the *pending* row (delete it, insert a new row):
  the new row goes to the back of the queue with a fresh id, as in memory.py.
* Integers: the protocol's naturals are unbounded but SQLite stores 64 bits.  An
  integer outside ``[-2**63, 2**63)`` is stored as a BLOB (4-byte big-endian length,
  then the big-endian magnitude), which sorts after every INTEGER and, among BLOBs,
  in numeric order; ``now`` is encoded the same way.  So comparisons and ``min``
  stay numeric and the value round-trips exactly, as the memory backend's Python
  ints do.  Negative values beyond 64 bits (unreachable: every stored integer is a
  natural) are refused.
* The outbox delivery lifecycle (``store.outbox``, :class:`SqliteOutbox`) moves
  the same rows through the states of ``outbox.rows`` (rules in ``store/outbox.py``),
  each step one transaction.
* Connection: autocommit mode (``isolation_level=None``) with explicit
  ``BEGIN IMMEDIATE``, so the write lock is taken when the batch starts, not at its
  first write (no lock upgrade, no ``SQLITE_BUSY`` half way through a batch).  It is
  used by one thread at a time, serialised by :attr:`Store.lock`.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final, TypeVar

import msgspec

from troth.outbox.rows import OutboxRow, RowState
from troth.protocol.records import (
    PENDING,
    TAG_BRANCH,
    Execute,
    OutboxEntry,
    Promise,
    PromiseRecord,
    Schedule,
    Tags,
    Task,
    Unblock,
    Value,
)
from troth.store.base import Backend, Store, StoreUnavailable
from troth.store.migrate import check_version, migrate
from troth.store.outbox import OutboxStore, OutboxTable
from troth.store.snapshot import snapshot
from troth.store.writes import Writes

__all__ = ["SqliteBackend", "SqliteOutbox", "SqliteStore"]

T = TypeVar("T")

# -- encoding ---------------------------------------------------------------------------

_encode = msgspec.json.Encoder().encode
_decode_value = msgspec.json.Decoder(Value).decode
_decode_tags = msgspec.json.Decoder(dict[str, str]).decode
_decode_strs = msgspec.json.Decoder(tuple[str, ...]).decode
_decode_record = msgspec.json.Decoder(PromiseRecord).decode

_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1


def _json(obj: Any) -> str:
    """JSON text (not bytes): SQLite's JSON functions refuse BLOB arguments."""
    return _encode(obj).decode()


def _int_in(n: int | None) -> int | bytes | None:
    """An integer as SQLite can store it (see the module docstring for BLOBs)."""
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


# -- statements ---------------------------------------------------------------------------

_PROMISE_COLS: Final = (
    "id, state, param, value, tags, timeout_at, created_at, settled_at, callbacks, listeners"
)
_TASK_COLS: Final = "id, state, version, ttl, pid, expires_at, retry_at, resumes"
_SCHEDULE_COLS: Final = (
    "id, cron, promise_id, promise_timeout, promise_param, promise_tags, created_at, "
    "next_run_at, last_run_at"
)
_OUTBOX_COLS: Final = (
    "id, address, kind, task_id, version, promise, created_at, state, attempts, "
    "available_at, claim_token, claimed_by, claimed_at, last_code, updated_at"
)

_GET_PROMISE: Final = f"SELECT {_PROMISE_COLS} FROM promises WHERE id = ?"
_GET_TASK: Final = f"SELECT {_TASK_COLS} FROM tasks WHERE id = ?"
_GET_SCHEDULE: Final = f"SELECT {_SCHEDULE_COLS} FROM schedules WHERE id = ?"

_UPSERT_PROMISE: Final = (
    "INSERT INTO promises (id, state, param, value, tags, timeout_at, created_at, settled_at,"
    " callbacks, listeners, external, branch, undrained)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET state = excluded.state, param = excluded.param,"
    " value = excluded.value, tags = excluded.tags, timeout_at = excluded.timeout_at,"
    " created_at = excluded.created_at, settled_at = excluded.settled_at,"
    " callbacks = excluded.callbacks, listeners = excluded.listeners,"
    " external = excluded.external, branch = excluded.branch, undrained = excluded.undrained"
)
_UPSERT_TASK: Final = (
    "INSERT INTO tasks (id, state, version, ttl, pid, expires_at, retry_at, resumes)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET state = excluded.state, version = excluded.version,"
    " ttl = excluded.ttl, pid = excluded.pid, expires_at = excluded.expires_at,"
    " retry_at = excluded.retry_at, resumes = excluded.resumes"
)
_UPSERT_SCHEDULE: Final = (
    "INSERT INTO schedules (id, cron, promise_id, promise_timeout, promise_param,"
    " promise_tags, created_at, next_run_at, last_run_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET cron = excluded.cron, promise_id = excluded.promise_id,"
    " promise_timeout = excluded.promise_timeout, promise_param = excluded.promise_param,"
    " promise_tags = excluded.promise_tags, created_at = excluded.created_at,"
    " next_run_at = excluded.next_run_at, last_run_at = excluded.last_run_at"
)
_DELETE_SCHEDULE: Final = "DELETE FROM schedules WHERE id = ?"
_DELETE_PENDING_MESSAGE: Final = "DELETE FROM outbox WHERE key = ? AND state = 'pending'"
_INSERT_MESSAGE: Final = (
    "INSERT INTO outbox (key, address, kind, task_id, version, promise, created_at,"
    " state, attempts, available_at, updated_at)"
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', 0, ?7, ?7)"
)

_BRANCH: Final = f"SELECT {_PROMISE_COLS} FROM promises WHERE branch = ? ORDER BY id LIMIT ?"
_DUE_PROMISES: Final = (
    "SELECT id FROM promises WHERE state = 'pending' AND external = 1 AND timeout_at <= ?"
    " ORDER BY timeout_at, id LIMIT ?"
)
# A task is either pending or acquired, so the two halves never share an id.  The
# ORDER BY on the compound itself (not on a subquery) lets SQLite merge two ordered
# index range scans instead of sorting.
_DUE_TASKS: Final = (
    "SELECT id, retry_at FROM tasks WHERE state = 'pending' AND retry_at <= ?1"
    " UNION ALL "
    "SELECT id, expires_at FROM tasks WHERE state = 'acquired' AND expires_at <= ?1"
    " ORDER BY 2, 1 LIMIT ?2"
)
_DUE_SCHEDULES: Final = (
    "SELECT id FROM schedules WHERE next_run_at <= ? ORDER BY next_run_at, id LIMIT ?"
)
_UNDRAINED: Final = "SELECT id FROM promises WHERE undrained = 1 ORDER BY id LIMIT ?"
_NEXT_DEADLINE: Final = (
    "SELECT EXISTS (SELECT 1 FROM promises WHERE undrained = 1),"
    " (SELECT min(timeout_at) FROM promises WHERE state = 'pending' AND external = 1),"
    " (SELECT min(retry_at) FROM tasks WHERE state = 'pending'),"
    " (SELECT min(expires_at) FROM tasks WHERE state = 'acquired'),"
    " (SELECT min(next_run_at) FROM schedules)"
)

# Outbox lifecycle (SqliteOutbox), mirroring memory.py's MemoryOutbox.
_SELECT_OUTBOX: Final = f"SELECT {_OUTBOX_COLS} FROM outbox"
_CLAIM: Final = (
    "UPDATE outbox SET state = 'dispatching', claim_token = ?, claimed_by = ?,"
    " claimed_at = ?, updated_at = ?"
    " WHERE id IN (SELECT id FROM outbox WHERE state = 'pending' AND available_at <= ?"
    " ORDER BY available_at, id LIMIT ?)"
    f" RETURNING {_OUTBOX_COLS}"
)
_HELD: Final = (
    "SELECT key, attempts FROM outbox WHERE id = ? AND state = 'dispatching' AND claim_token = ?"
)
_IN_STATE: Final = "SELECT key, attempts FROM outbox WHERE id = ? AND state = ?"
_HAS_PENDING: Final = "SELECT 1 FROM outbox WHERE key = ? AND state = 'pending'"
_FINISH: Final = (
    "UPDATE outbox SET state = ?, attempts = ?, claim_token = NULL, last_code = ?,"
    " updated_at = ? WHERE id = ?"
)
_REQUEUE: Final = (
    "UPDATE outbox SET state = 'pending', attempts = ?, claim_token = NULL, last_code = ?,"
    " updated_at = ?, available_at = ? WHERE id = ?"
)
_UNKNOWN_ROWS: Final = f"{_SELECT_OUTBOX} WHERE state = 'outcome_unknown' ORDER BY id LIMIT ?"
_RELEASE_EXPIRED: Final = (
    "UPDATE outbox SET state = 'outcome_unknown', claim_token = NULL, last_code = ?,"
    " updated_at = ? WHERE state = 'dispatching' AND coalesce(claimed_at, 0) < ?"
)
_PURGE_COMPLETED: Final = "DELETE FROM outbox WHERE state = 'completed' AND updated_at < ?"
_NEXT_DUE: Final = "SELECT min(available_at) FROM outbox WHERE state = 'pending'"

_TABLES: Final = ("promises", "tasks", "schedules", "outbox")
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
) -> str:
    where: list[str] = []
    if after:
        where.append("id > ?")
    if states is not None:
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


# -- rows <-> records ------------------------------------------------------------------------


def _promise_row(p: Promise) -> tuple[Any, ...]:
    undrained = p.state != PENDING and bool(p.callbacks or p.listeners)
    return (
        p.id,
        p.state,
        _json(p.param),
        _json(p.value),
        _json(p.tags),
        _int_in(p.timeout_at),
        _int_in(p.created_at),
        _int_in(p.settled_at),
        _json(p.callbacks),
        _json(p.listeners),
        int(p.external),
        p.tags.get(TAG_BRANCH) or None,
        int(undrained),
    )


def _promise(r: Sequence[Any]) -> Promise:
    return Promise(
        r[0],
        r[1],
        _decode_value(r[2]),
        _decode_value(r[3]),
        _decode_tags(r[4]),
        _int_out(r[5]),
        _int_out(r[6]),
        _int_out(r[7]),
        _decode_strs(r[8]),
        _decode_strs(r[9]),
    )


def _task_row(t: Task) -> tuple[Any, ...]:
    return (
        t.id,
        t.state,
        _int_in(t.version),
        _int_in(t.ttl),
        t.pid,
        _int_in(t.expires_at),
        _int_in(t.retry_at),
        _json(t.resumes),
    )


def _task(r: Sequence[Any]) -> Task:
    return Task(
        r[0],
        r[1],
        _int_out(r[2]),
        _int_out(r[3]),
        r[4],
        _int_out(r[5]),
        _int_out(r[6]),
        _decode_strs(r[7]),
    )


def _schedule_row(s: Schedule) -> tuple[Any, ...]:
    return (
        s.id,
        s.cron,
        s.promise_id,
        _int_in(s.promise_timeout),
        _json(s.promise_param),
        _json(s.promise_tags),
        _int_in(s.created_at),
        _int_in(s.next_run_at),
        _int_in(s.last_run_at),
    )


def _schedule(r: Sequence[Any]) -> Schedule:
    return Schedule(
        r[0],
        r[1],
        r[2],
        _int_out(r[3]),
        _decode_value(r[4]),
        _decode_tags(r[5]),
        _int_out(r[6]),
        _int_out(r[7]),
        _int_out(r[8]),
    )


def _message_row(key: str, entry: OutboxEntry, now: int | bytes | None) -> tuple[Any, ...]:
    m = entry.message
    if isinstance(m, Execute):
        return (key, entry.address, "execute", m.task_id, _int_in(m.version), None, now)
    return (key, entry.address, "unblock", None, None, _json(m.promise), now)


def _outbox_row(r: Sequence[Any]) -> OutboxRow:
    """A stored outbox row as memory.py's :class:`OutboxRow` (for ``snapshot``)."""
    if r[2] == "execute":
        message: Execute | Unblock = Execute(r[3], _int_out(r[4]))
    else:
        message = Unblock(_decode_record(r[5]))
    return OutboxRow(
        id=r[0],
        entry=OutboxEntry(r[1], message),
        created_at=_int_out(r[6]),
        state=r[7],
        attempts=r[8],
        available_at=_int_out(r[9]),
        claim_token=r[10],
        claimed_by=r[11],
        claimed_at=_int_out(r[12]),
        last_code=r[13],
        updated_at=_int_out(r[14]),
    )


# -- the backend -----------------------------------------------------------------------------


class SqliteBackend(Backend):
    """Reads and writes of the transaction that :meth:`SqliteStore.begin` opened."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    # -- reads ------------------------------------------------------------------------

    def get_promise(self, id: str) -> Promise | None:
        r = self.conn.execute(_GET_PROMISE, (id,)).fetchone()
        return None if r is None else _promise(r)

    def get_task(self, id: str) -> Task | None:
        r = self.conn.execute(_GET_TASK, (id,)).fetchone()
        return None if r is None else _task(r)

    def get_schedule(self, id: str) -> Schedule | None:
        r = self.conn.execute(_GET_SCHEDULE, (id,)).fetchone()
        return None if r is None else _schedule(r)

    def scan_promises(
        self, states: Collection[str] | None, tags: Tags, after: str | None, limit: int
    ) -> list[Promise]:
        if states is not None and not states:
            return []
        sql = _scan_sql(
            "promises",
            _PROMISE_COLS,
            None if states is None else len(states),
            "tags",
            len(tags),
            after is not None,
        )
        rows = self.conn.execute(sql, _scan_params(after, states, tags, limit)).fetchall()
        return [_promise(r) for r in rows]

    def scan_tasks(
        self, states: Collection[str] | None, after: str | None, limit: int
    ) -> list[Task]:
        if states is not None and not states:
            return []
        sql = _scan_sql(
            "tasks", _TASK_COLS, None if states is None else len(states), None, 0, after is not None
        )
        rows = self.conn.execute(sql, _scan_params(after, states, {}, limit)).fetchall()
        return [_task(r) for r in rows]

    def scan_schedules(self, tags: Tags, after: str | None, limit: int) -> list[Schedule]:
        sql = _scan_sql(
            "schedules", _SCHEDULE_COLS, None, "promise_tags", len(tags), after is not None
        )
        rows = self.conn.execute(sql, _scan_params(after, None, tags, limit)).fetchall()
        return [_schedule(r) for r in rows]

    def promises_in_branch(self, branch: str, limit: int) -> list[Promise]:
        if not branch:
            return []  # the empty branch is never indexed (memory.py: ``if branch:``)
        rows = self.conn.execute(_BRANCH, (branch, limit)).fetchall()
        return [_promise(r) for r in rows]

    # -- deadlines ----------------------------------------------------------------------

    def _ids(self, sql: str, params: tuple[Any, ...]) -> list[str]:
        return [r[0] for r in self.conn.execute(sql, params)]

    def due_promises(self, now: int, limit: int) -> list[str]:
        return self._ids(_DUE_PROMISES, (_int_in(now), limit))

    def due_tasks(self, now: int, limit: int) -> list[str]:
        return self._ids(_DUE_TASKS, (_int_in(now), limit))

    def due_schedules(self, now: int, limit: int) -> list[str]:
        return self._ids(_DUE_SCHEDULES, (_int_in(now), limit))

    def undrained_promises(self, limit: int) -> list[str]:
        return self._ids(_UNDRAINED, (limit,))

    def next_deadline(self) -> int | None:
        undrained, *armed = self.conn.execute(_NEXT_DEADLINE).fetchone()
        candidates: list[int] = [_int_out(d) for d in armed if d is not None]
        if undrained:
            candidates.append(0)
        return min(candidates) if candidates else None

    # -- writes -------------------------------------------------------------------------

    def apply(self, writes: Writes, now: int) -> None:
        execute = self.conn.execute
        for p in writes.promises.values():
            execute(_UPSERT_PROMISE, _promise_row(p))
        for t in writes.tasks.values():
            execute(_UPSERT_TASK, _task_row(t))
        for id, s in writes.schedules.items():
            if s is None:
                execute(_DELETE_SCHEDULE, (id,))
            else:
                execute(_UPSERT_SCHEDULE, _schedule_row(s))
        stamp = _int_in(now)
        for key, entry in writes.messages.items():
            execute(_DELETE_PENDING_MESSAGE, (key,))
            execute(_INSERT_MESSAGE, _message_row(key, entry, stamp))

    # -- whole-store reads -----------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything, in memory.py's ``snapshot()`` format (built from the same Structs)."""
        q = self.conn.execute
        return snapshot(
            (_promise(r) for r in q(f"SELECT {_PROMISE_COLS} FROM promises ORDER BY id")),
            (_task(r) for r in q(f"SELECT {_TASK_COLS} FROM tasks ORDER BY id")),
            (_schedule(r) for r in q(f"SELECT {_SCHEDULE_COLS} FROM schedules ORDER BY id")),
            (_outbox_row(r) for r in q(f"{_SELECT_OUTBOX} ORDER BY id").fetchall()),
        )


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
            conn.execute("PRAGMA busy_timeout = 5000")
            # Refuse a newer schema before anything (even the journal mode) is changed.
            check_version(conn)
            if self.path not in (":memory:", ""):
                conn.execute("PRAGMA journal_mode = WAL").fetchone()
            conn.execute(f"PRAGMA synchronous = {mode.upper()}")
            migrate(conn)
        except BaseException:
            conn.close()
            raise
        self.conn = conn
        self.backend = SqliteBackend(conn)
        self.outbox = SqliteOutbox(self)

    # -- transactions --------------------------------------------------------------------

    def begin(self) -> Backend:
        if self.conn.in_transaction:
            # Only reachable if a previous batch died between begin and commit/rollback;
            # nothing of it was acknowledged, so dropping it is the right thing.
            self.conn.execute("ROLLBACK")
        self.conn.execute("BEGIN IMMEDIATE")
        return self.backend

    def commit(self) -> None:
        self.conn.execute("COMMIT")

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

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    def schema_version(self) -> int:
        """The stored schema version (for diagnostics and tests)."""
        with self.lock:
            return check_version(self.conn)


class SqliteOutbox(OutboxStore):
    """The outbox-row lifecycle (``store/outbox.py``) over the outbox table: each call
    one ``BEGIN IMMEDIATE`` transaction, so a claim is atomic even with other
    processes on the same file."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    def write(self, fn: Callable[[OutboxTable], T]) -> T:
        with self.store.transaction() as conn:
            return fn(SqliteOutboxTable(conn))

    def read(self, fn: Callable[[OutboxTable], T]) -> T:
        with self.store.lock:
            return fn(SqliteOutboxTable(self.store.conn))


class SqliteOutboxTable(OutboxTable):
    """Memory's ``pending_by_key`` is the partial unique index here: a row is "the
    pending row of its key" exactly while its state is ``pending``."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def claim(self, worker_id: str, now: int, limit: int, token: str) -> list[OutboxRow]:
        at = _int_in(now)
        claimed = self.conn.execute(_CLAIM, (token, worker_id, at, at, at, limit)).fetchall()
        return [_outbox_row(r) for r in claimed]

    def find(self, row_id: int, state: RowState, token: str | None) -> tuple[str, int] | None:
        if token is None:
            found = self.conn.execute(_IN_STATE, (row_id, str(state))).fetchone()
        else:
            found = self.conn.execute(_HELD, (row_id, token)).fetchone()
        return None if found is None else (found[0], found[1])

    def has_pending(self, key: str) -> bool:
        return self.conn.execute(_HAS_PENDING, (key,)).fetchone() is not None

    def finish(
        self, row_id: int, state: RowState, attempts: int, code: str | None, now: int
    ) -> None:
        self.conn.execute(_FINISH, (str(state), attempts, code, _int_in(now), row_id))

    def requeue(
        self, row_id: int, attempts: int, code: str | None, now: int, available_at: int
    ) -> None:
        self.conn.execute(_REQUEUE, (attempts, code, _int_in(now), _int_in(available_at), row_id))

    def unknown_rows(self, limit: int) -> list[OutboxRow]:
        return [_outbox_row(r) for r in self.conn.execute(_UNKNOWN_ROWS, (limit,))]

    def release_expired(self, cutoff: int, now: int, code: str) -> int:
        return self.conn.execute(_RELEASE_EXPIRED, (code, _int_in(now), _int_in(cutoff))).rowcount

    def purge_completed(self, before: int) -> int:
        return self.conn.execute(_PURGE_COMPLETED, (_int_in(before),)).rowcount

    def next_due(self) -> int | None:
        found: int | None = _int_out(self.conn.execute(_NEXT_DUE).fetchone()[0])
        return found
