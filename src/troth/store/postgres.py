"""The PostgreSQL backend: several troth nodes may share one database.

It answers exactly as :class:`~troth.store.memory.MemoryBackend` and the SQLite
backend do (same queries, same ``snapshot()``); what it adds is correctness when
other processes write the same rows at the same time.  How, and why:

* **One transaction per group-commit batch**, READ COMMITTED, on one connection
  owned by the store (the engine calls the store from its single writer thread,
  under :attr:`Store.lock`).  The outbox lifecycle (claims, settlements) has a
  connection and a thread of its own (:class:`OutboxSession`), with
  ``synchronous_commit = off``: it does not wait behind request batches.
* **Reads lock what they read, once.**  A batch starts by reading, locked, every
  row its requests name (``prefetch``: one ``SELECT … WHERE id = ANY(…) ORDER BY
  id FOR UPDATE`` per table); other point reads are ``SELECT … FOR UPDATE`` as the
  machine reaches them.  A row a batch has read stays as read until it commits,
  so the backend keeps it (updated by the batch's own writes) and answers later
  reads from memory: every answer is computed from rows nobody else can change
  meanwhile, at the cost of a few statements per batch rather than one per read.
  ``get_task`` locks the task's promise (same id) first: the machine reads a task
  and its promise in either order (``task.acquire`` task first,
  ``promise.settle`` promise first), and one fixed order per id removes the
  commonest deadlock between two nodes.  Due lists bring their rows along.
* **Absent rows lock nothing**; instead the backend remembers which ids it read as
  absent.  Writing such an id is a plain ``INSERT``, so if another node created it
  meanwhile the insert fails with a unique violation; reading it again and finding
  it means the same.  Either way this batch's view is stale.
* **Writes are deferred and coalesced**: they wait in the backend until a statement
  must see them (a read the cache cannot answer, a scan) or the COMMIT, then go
  as one multi-row statement per table (parallel arrays, binary parameters), the
  last version of each row in sorted id order and the outbox in emission order
  (row ids are handed out in that order and decide delivery order).  Outbox rows
  never need an order of their own: a job writes a message only for a task or
  promise whose row it already holds.  A deferred write that fails for a reason
  a re-run cannot cure cannot be pinned on one job, so the batch runs again
  writing job by job (``_Careful``), and the failing job is set aside alone.
* **Stale view, deadlock or lock timeout: run the batch again.**  The machine is
  pure (a job's effect depends only on what it read), so a batch that meets
  SQLSTATE 40001, 40P01, 23505 or 55P03, a lost connection before COMMIT, or a
  phantom, is rolled back and re-run whole from fresh overlays, after a short
  jittered backoff, up to :data:`MAX_ATTEMPTS` times.  No job ever sees those
  errors; only a batch that loses every attempt fails (:class:`StoreBusy`, 500).
  A failed COMMIT is never retried: it may have happened.
* **Lock order.**  A batch first locks, per table in sorted id order and without a
  timeout, the ids its requests name (``Job.keys``, from ``machine.core.lock_keys``:
  the promise or task id, a callback's awaited and awaiter, a heartbeat's tasks).
  Rows reached only while a job runs (a settle's awaiters, a fence's inner create)
  are locked as the machine reads them, and a wait for one of those is bounded by
  :data:`LOCK_TIMEOUT` (PostgreSQL's own ``deadlock_timeout`` is 1 s and only a
  superuser may lower it): any cycle must contain such a wait, so it ends fast.
  A re-run first locks every row the earlier attempts touched, the same way, so
  a contended batch gets through after one or two re-runs instead of losing
  again.  (8 nodes × 200 requests on three hot ids: 5 re-runs with declared ids,
  84 without — ``tests/test_store_postgres.py``.)
* **No savepoint per job.**  Each savepoint with writes is a subtransaction, and
  more than 64 in one transaction overflow PostgreSQL's per-backend subxid cache,
  which slows every snapshot on the server.  Group commit's isolation (a failing
  job is discarded alone) comes from re-running instead: a job whose reads or
  writes fail with any other database error is set aside with that error and the
  batch is run again without it.  That costs a re-run only when it happens.
* **Timer and delivery work is shared, not duplicated**: due lists and outbox
  claims are ``FOR UPDATE SKIP LOCKED``, so two nodes never fire the same deadline
  or claim the same row at once, and neither waits for the other.
* **Several nodes** (``server/cluster.py``): with :attr:`PostgresOutbox.routing`
  set, a node claims only the ``poll://`` rows it can deliver (``_CLAIM_ROUTED``);
  :meth:`PostgresOutbox.notify` wakes the others (messages it left, an earlier
  deadline).
* **Integers**: instants, versions and ttls are ``NUMERIC`` (exact, unbounded,
  numerically ordered), so the protocol's naturals beyond 2**63 round-trip exactly,
  as in memory.py, rather than being refused.
* **Text**: PostgreSQL text cannot hold U+0000.  :meth:`PostgresBackend.apply`
  refuses such an id, tag, address or key with :class:`Unstorable` before writing
  anything (the job fails alone); reads of such ids find nothing, and filters
  containing it match nothing, which is what the stored data says.

What is not prevented: write skew across two absent rows (batch A reads X absent
and creates Y while batch B reads Y absent and creates X).  No handler does that
today: an absent read either ends the request with an error and no writes, or is
followed by creating that very row.  ``SERIALIZABLE`` or advisory locks on absent
ids would close it, at a price every request pays.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgspec
import psycopg
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus

from troth.outbox.rows import OutboxRow, RowState, Settlement
from troth.protocol.address import parse_poll
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
from troth.store.base import Backend, Job, Outcome, Overlay, Store, StoreUnavailable
from troth.store.migrate import Migration, SchemaTooNew, load_migrations
from troth.store.outbox import OutboxStore, OutboxTable
from troth.store.snapshot import snapshot
from troth.store.writes import Writes

__all__ = ["PostgresBackend", "PostgresOutbox", "PostgresStore", "StoreBusy", "Unstorable"]

log = logging.getLogger("troth.store.postgres")
T = TypeVar("T")

Conn = psycopg.Connection[tuple[Any, ...]]
Cur = psycopg.Cursor[tuple[Any, ...]]

#: Attempts of one batch (or one outbox transaction) before it fails.
MAX_ATTEMPTS: Final = 10
#: Ceiling of the jittered backoff between attempts, in seconds.
MAX_BACKOFF: Final = 0.05
#: How long a first attempt waits for a row lock before it gives up and re-runs
#: (``lock_timeout``): a deadlock ends this fast instead of after the server's
#: ``deadlock_timeout`` (1 s by default, and only a superuser may lower it).
LOCK_TIMEOUT: Final = 0.05

#: SQLSTATEs after which re-running the whole transaction is the answer:
#: serialization failure, deadlock, unique violation (a row this batch read as
#: absent was created by someone else), lock not available (a ``lock_timeout``).
_RETRY_SQLSTATES: Final = frozenset({"40001", "40P01", "23505", "55P03"})

_NUL: Final = "\x00"


def _has_nul(texts: Collection[str]) -> bool:
    return any(_NUL in t for t in texts)


class StoreBusy(StoreUnavailable):
    """A batch lost every attempt to concurrent transactions (the jobs get 500)."""


class Phantom(Exception):
    """A row this transaction read as absent exists now: its view is stale."""


class Unstorable(ValueError):
    """A value PostgreSQL cannot store; raised before any statement of the job is sent."""


# -- encoding ---------------------------------------------------------------------------

_encode = msgspec.json.Encoder().encode
_decode_value = msgspec.json.Decoder(Value).decode
_decode_tags = msgspec.json.Decoder(dict[str, str]).decode
_decode_strs = msgspec.json.Decoder(tuple[str, ...]).decode
_decode_record = msgspec.json.Decoder(PromiseRecord).decode


def _json(obj: Any) -> str:
    """msgspec JSON as text: the same bytes SQLite stores, so reads decode alike."""
    return _encode(obj).decode()


class _IntLoader(Loader):
    """NUMERIC columns hold integers only; load them as ``int``, not ``Decimal``."""

    def load(self, data: Buffer) -> int:
        return int(bytes(data))


def _refuse_nul(writes: Writes) -> None:
    """Raise before anything is sent if a value PostgreSQL text cannot hold is written.

    Only text the server stores or parses as such counts: ids, states, tag keys and
    values (searched through ``jsonb``), addresses, keys.  Other JSON columns are
    msgspec text, where U+0000 is escaped.
    """
    texts: list[str] = []
    for p in writes.promises.values():
        texts += (p.id, p.state, *p.tags, *p.tags.values())
    for t in writes.tasks.values():
        texts += (t.id, t.state, t.pid or "")
    for id, s in writes.schedules.items():
        texts.append(id)
        if s is not None:
            texts += (s.cron, s.promise_id, *s.promise_tags, *s.promise_tags.values())
    for key, entry in writes.messages.items():
        texts += (key, entry.address)
        if isinstance(entry.message, Execute):
            texts.append(entry.message.task_id)
    for text in texts:
        if _NUL in text:
            raise Unstorable(f"PostgreSQL text cannot hold U+0000: refusing to store {text!r}")


# -- statements -----------------------------------------------------------------------------

_PROMISE_COLS: Final = (
    "id, state, param, value, tags, timeout_at, created_at, settled_at, callbacks, listeners"
)
_TASK_COLS: Final = "id, state, version, ttl, pid, expires_at, retry_at, resumes"
_SCHEDULE_COLS: Final = (
    "id, cron, promise_id, promise_timeout, promise_param, promise_tags, created_at, "
    "next_run_at, last_run_at"
)
_OUTBOX_COLUMNS: Final = (
    "id",
    "address",
    "kind",
    "task_id",
    "version",
    "promise",
    "created_at",
    "state",
    "attempts",
    "available_at",
    "claim_token",
    "claimed_by",
    "claimed_at",
    "last_code",
    "updated_at",
)
_OUTBOX_COLS: Final = ", ".join(_OUTBOX_COLUMNS)

_GET_PROMISE: Final = f"SELECT {_PROMISE_COLS} FROM promises WHERE id = %s FOR UPDATE"
# The uncorrelated sub-select runs once, as a one-time filter before the task is
# scanned, so the promise is locked before the task (see the module docstring).
_GET_TASK: Final = (
    f"SELECT {_TASK_COLS} FROM tasks WHERE id = %(id)s"
    " AND (SELECT count(*) FROM (SELECT 1 FROM promises WHERE id = %(id)s FOR UPDATE) AS p) >= 0"
    " FOR UPDATE OF tasks"
)
_GET_SCHEDULE: Final = f"SELECT {_SCHEDULE_COLS} FROM schedules WHERE id = %s FOR UPDATE"

_INSERT_PROMISE: Final = (
    "INSERT INTO promises (id, state, param, value, tags, timeout_at, created_at, settled_at,"
    " callbacks, listeners, external, branch, undrained)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_UPSERT_PROMISE: Final = (
    f"{_INSERT_PROMISE} ON CONFLICT (id) DO UPDATE SET state = excluded.state,"
    " param = excluded.param, value = excluded.value, tags = excluded.tags,"
    " timeout_at = excluded.timeout_at, created_at = excluded.created_at,"
    " settled_at = excluded.settled_at, callbacks = excluded.callbacks,"
    " listeners = excluded.listeners, external = excluded.external,"
    " branch = excluded.branch, undrained = excluded.undrained"
)
_INSERT_TASK: Final = (
    "INSERT INTO tasks (id, state, version, ttl, pid, expires_at, retry_at, resumes)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)
_UPSERT_TASK: Final = (
    f"{_INSERT_TASK} ON CONFLICT (id) DO UPDATE SET state = excluded.state,"
    " version = excluded.version, ttl = excluded.ttl, pid = excluded.pid,"
    " expires_at = excluded.expires_at, retry_at = excluded.retry_at,"
    " resumes = excluded.resumes"
)
_INSERT_SCHEDULE: Final = (
    "INSERT INTO schedules (id, cron, promise_id, promise_timeout, promise_param,"
    " promise_tags, created_at, next_run_at, last_run_at)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_UPSERT_SCHEDULE: Final = (
    f"{_INSERT_SCHEDULE} ON CONFLICT (id) DO UPDATE SET cron = excluded.cron,"
    " promise_id = excluded.promise_id, promise_timeout = excluded.promise_timeout,"
    " promise_param = excluded.promise_param, promise_tags = excluded.promise_tags,"
    " created_at = excluded.created_at, next_run_at = excluded.next_run_at,"
    " last_run_at = excluded.last_run_at"
)
_DELETE_SCHEDULE: Final = "DELETE FROM schedules WHERE id = %s"
# The keyed upsert of the *pending* row: a new message replaces it as a fresh row
# (a new id from the sequence, so it goes to the back of the queue; every lifecycle
# column reset), which is memory.py's delete-then-insert in one statement.  Rows of
# the key in other states are not the arbiter's, so a claimed row is never touched.
_UPSERT_MESSAGE: Final = (
    "INSERT INTO outbox (key, address, kind, task_id, version, promise, created_at,"
    " state, attempts, available_at, updated_at, dest_cast, dest_group, dest_id)"
    " VALUES (%(key)s, %(address)s, %(kind)s, %(task_id)s, %(version)s, %(promise)s,"
    " %(now)s, 'pending', 0, %(now)s, %(now)s, %(cast)s, %(group)s, %(dest)s)"
    " ON CONFLICT (key) WHERE state = 'pending' DO UPDATE SET id = excluded.id,"
    " address = excluded.address, kind = excluded.kind, task_id = excluded.task_id,"
    " dest_cast = excluded.dest_cast, dest_group = excluded.dest_group,"
    " dest_id = excluded.dest_id,"
    " version = excluded.version, promise = excluded.promise,"
    " created_at = excluded.created_at, attempts = 0, available_at = excluded.available_at,"
    " claim_token = NULL, claimed_by = NULL, claimed_at = NULL, last_code = NULL,"
    " updated_at = excluded.updated_at"
)

# Many rows per statement (a batch's deferred writes, coalesced per id): the columns
# arrive as parallel arrays, numbers as text (exact at any size) cast to NUMERIC.
_P_TYPES: Final = (
    "text", "text", "text", "text", "text", "numeric", "numeric", "numeric",
    "text", "text", "bool", "text", "bool",
)  # fmt: skip
_T_TYPES: Final = ("text", "text", "numeric", "numeric", "text", "numeric", "numeric", "text")
_NUMERIC_P: Final = frozenset(i for i, t in enumerate(_P_TYPES) if t == "numeric")
_NUMERIC_T: Final = frozenset(i for i, t in enumerate(_T_TYPES) if t == "numeric")


def _unnest(types: Sequence[str]) -> str:
    # %b: arrays go in binary format (psycopg's text-format array dumper escapes
    # every element in Python, ten times slower than the binary one).
    return ", ".join(f"%b::text[]::{t}[]" if t == "numeric" else f"%b::{t}[]" for t in types)


def _columns(rows: Sequence[tuple[Any, ...]], numeric: frozenset[int]) -> list[list[Any]]:
    """Rows to parallel column arrays (numbers as exact text)."""
    cols: list[list[Any]] = [list(c) for c in zip(*rows, strict=True)]
    for i in numeric:
        cols[i] = [None if v is None else str(v) for v in cols[i]]
    return cols


def _upsert_many(insert: str) -> str:
    """``INSERT … VALUES (…) [ON CONFLICT …]`` as one statement for many rows."""
    head, _, rest = insert.partition(" VALUES (")
    _, _, conflict = rest.partition(")")
    types = _P_TYPES if head.startswith("INSERT INTO promises") else _T_TYPES
    return f"{head} SELECT * FROM unnest({_unnest(types)}){conflict}"


_INSERT_PROMISES: Final = _upsert_many(_INSERT_PROMISE)
_UPSERT_PROMISES: Final = _upsert_many(_UPSERT_PROMISE)
_INSERT_TASKS: Final = _upsert_many(_INSERT_TASK)
_UPSERT_TASKS: Final = _upsert_many(_UPSERT_TASK)
_MESSAGE_FIELDS: Final = (
    "key", "address", "kind", "task_id", "version", "promise", "now", "cast", "group", "dest",
)  # fmt: skip
_UPSERT_MESSAGES: Final = (
    "INSERT INTO outbox (key, address, kind, task_id, version, promise, created_at,"
    " state, attempts, available_at, updated_at, dest_cast, dest_group, dest_id)"
    " SELECT m.key, m.address, m.kind, m.task_id, m.version::numeric, m.promise,"
    " m.now::numeric, 'pending', 0, m.now::numeric, m.now::numeric, m.cast_, m.grp, m.dest"
    " FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],"
    " %b::text[], %b::text[], %b::text[], %b::text[]) WITH ORDINALITY"
    " AS m(key, address, kind, task_id, version, promise, now, cast_, grp, dest, ord)"
    # In emission order: row ids decide delivery order.
    " ORDER BY m.ord" + _UPSERT_MESSAGE[_UPSERT_MESSAGE.index(" ON CONFLICT") :]
)

_BRANCH: Final = f"SELECT {_PROMISE_COLS} FROM promises WHERE branch = %s ORDER BY id LIMIT %s"
_DUE_PROMISES: Final = (
    f"SELECT {_PROMISE_COLS} FROM promises"
    " WHERE state = 'pending' AND external AND timeout_at <= %s"
    " ORDER BY timeout_at, id LIMIT %s FOR UPDATE SKIP LOCKED"
)
# A task is either pending or acquired, so its one live deadline is a CASE; one
# query (not SQLite's UNION ALL, which cannot take FOR UPDATE) keeps the LIMIT exact.
_DUE_TASKS: Final = (
    f"SELECT {_TASK_COLS} FROM tasks"
    " WHERE (state = 'pending' AND retry_at <= %(now)s)"
    " OR (state = 'acquired' AND expires_at <= %(now)s)"
    " ORDER BY CASE WHEN state = 'pending' THEN retry_at ELSE expires_at END, id"
    " LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
)
_DUE_SCHEDULES: Final = (
    "SELECT id FROM schedules WHERE next_run_at <= %s ORDER BY next_run_at, id LIMIT %s"
    " FOR UPDATE SKIP LOCKED"
)
_UNDRAINED: Final = (
    "SELECT id FROM promises WHERE undrained ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
)
_NEXT_DEADLINE: Final = (
    "SELECT EXISTS (SELECT 1 FROM promises WHERE undrained),"
    " (SELECT min(timeout_at) FROM promises WHERE state = 'pending' AND external),"
    " (SELECT min(retry_at) FROM tasks WHERE state = 'pending'),"
    " (SELECT min(expires_at) FROM tasks WHERE state = 'acquired'),"
    " (SELECT min(next_run_at) FROM schedules)"
)

# Outbox lifecycle (PostgresOutbox), mirroring memory.py's MemoryOutbox.
_SELECT_OUTBOX: Final = f"SELECT {_OUTBOX_COLS} FROM outbox"
# MATERIALIZED: the locked id list is computed once, so the UPDATE can never see
# more rows than the LIMIT took (an inlined IN-subquery may be re-scanned).
_CLAIM: Final = (
    "WITH due AS MATERIALIZED (SELECT id FROM outbox"
    " WHERE state = 'pending' AND available_at <= %(now)s"
    " ORDER BY available_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
    " UPDATE outbox AS o SET state = 'dispatching', claim_token = %(token)s,"
    " claimed_by = %(worker)s, claimed_at = %(now)s, updated_at = %(now)s"
    " FROM due WHERE o.id = due.id"
    f" RETURNING {', '.join(f'o.{c}' for c in _OUTBOX_COLUMNS)}"
)
# The claim of one node among several (server/cluster.py): besides http(s) rows, it
# takes the poll:// rows it can deliver itself, and those no live node can (they are
# tried, found undeliverable and backed off, as on a single node).  ``others`` is what
# the other live nodes hold, by the database's clock.  For anycast with a preferred
# id, the node holding that id comes first; else any node holding the group.
_OTHERS_HOLD: Final = "SELECT 1 FROM others AS x WHERE x.grp = o.dest_group"
_CLAIM_ROUTED: Final = (
    "WITH others AS MATERIALIZED (SELECT c.grp, c.pid FROM connections AS c"
    " JOIN nodes AS n ON n.node = c.node WHERE c.node <> %(node)s"
    " AND n.seen_at >= extract(epoch FROM clock_timestamp()) * 1000 - %(timeout)s),"
    " due AS MATERIALIZED (SELECT o.id FROM outbox AS o"
    " WHERE o.state = 'pending' AND o.available_at <= %(now)s AND ("
    " o.dest_group IS NULL"
    " OR (o.dest_id IS NOT NULL AND o.dest_group || '/' || o.dest_id = ANY(%(pairs)b))"
    f" OR (o.dest_cast = 'uni' AND NOT EXISTS ({_OTHERS_HOLD} AND x.pid = o.dest_id))"
    f" OR (o.dest_cast = 'any' AND NOT EXISTS ({_OTHERS_HOLD} AND x.pid = o.dest_id)"
    f" AND (o.dest_group = ANY(%(groups)b) OR NOT EXISTS ({_OTHERS_HOLD}))))"
    " ORDER BY o.available_at, o.id LIMIT %(limit)s FOR UPDATE OF o SKIP LOCKED)"
    " UPDATE outbox AS o SET state = 'dispatching', claim_token = %(token)s,"
    " claimed_by = %(worker)s, claimed_at = %(now)s, updated_at = %(now)s"
    " FROM due WHERE o.id = due.id"
    f" RETURNING {', '.join(f'o.{c}' for c in _OUTBOX_COLUMNS)}"
)
# FOR UPDATE: a concurrent reaper or settlement must not slip between the check and
# the update (READ COMMITTED re-checks the WHERE on the row it finally locks).
_HELD: Final = (
    "SELECT key, attempts FROM outbox WHERE id = %s AND state = 'dispatching'"
    " AND claim_token = %s FOR UPDATE"
)
_IN_STATE: Final = "SELECT key, attempts FROM outbox WHERE id = %s AND state = %s FOR UPDATE"
_HAS_PENDING: Final = "SELECT 1 FROM outbox WHERE key = %s AND state = 'pending'"
_FINISH: Final = (
    "UPDATE outbox SET state = %s, attempts = %s, claim_token = NULL, last_code = %s,"
    " updated_at = %s WHERE id = %s"
)
# _HELD then _FINISH for many distinct rows at once; a failure counts an attempt.
_FINISH_MANY: Final = (
    "UPDATE outbox AS o SET state = v.state, attempts = o.attempts + v.failed,"
    " claim_token = NULL, last_code = v.code, updated_at = v.now::numeric"
    " FROM unnest(%b::bigint[], %b::text[], %b::text[], %b::int[], %b::text[], %b::text[])"
    " AS v(id, token, state, failed, code, now)"
    " WHERE o.id = v.id AND o.state = 'dispatching' AND o.claim_token = v.token"
    " RETURNING o.id"
)
_REQUEUE: Final = (
    "UPDATE outbox SET state = 'pending', attempts = %s, claim_token = NULL, last_code = %s,"
    " updated_at = %s, available_at = %s WHERE id = %s"
)
_UNKNOWN_ROWS: Final = f"{_SELECT_OUTBOX} WHERE state = 'outcome_unknown' ORDER BY id LIMIT %s"
_RELEASE_EXPIRED: Final = (
    "UPDATE outbox SET state = 'outcome_unknown', claim_token = NULL, last_code = %s,"
    " updated_at = %s WHERE state = 'dispatching' AND coalesce(claimed_at, 0) < %s"
)
_PURGE_COMPLETED: Final = "DELETE FROM outbox WHERE state = 'completed' AND updated_at < %s"
_NEXT_DUE: Final = "SELECT min(available_at) FROM outbox WHERE state = 'pending'"

#: The channel of ``PostgresOutbox.notify``; its payload is
#: ``"{node} {messages} {deadline|-}"`` (``server/cluster.py``).
CHANNEL: Final = "troth"
# At COMMIT, a notifying transaction takes one database-wide lock, held by the other
# notifying commits for the length of their flush: waiting for it is not a deadlock
# risk, so the batch's short lock_timeout is lifted for it.
_NOTIFY: Final = f"SELECT set_config('lock_timeout', '0', true), pg_notify('{CHANNEL}', %s)"

# DELETE under an exclusive lock rather than TRUNCATE: same effect for a debug reset,
# ~2 ms instead of ~45 ms (TRUNCATE makes new files for every table and index), which
# the test suite pays before every test.
_RESET: Final = (
    "LOCK TABLE promises, tasks, schedules, outbox IN ACCESS EXCLUSIVE MODE;"
    " DELETE FROM outbox; DELETE FROM tasks; DELETE FROM promises; DELETE FROM schedules;"
    " ALTER TABLE outbox ALTER COLUMN id RESTART"
)

#: The tables whose rows a batch locks, in the order a re-run locks them.
_TABLES: Final = ("promises", "tasks", "schedules")
Touched = dict[str, set[str]]
# ORDER BY before FOR UPDATE: rows are locked in sorted id order.
_PRELOCK: Final = {
    "promises": f"SELECT {_PROMISE_COLS} FROM promises WHERE id = ANY(%b) ORDER BY id FOR UPDATE",
    "tasks": f"SELECT {_TASK_COLS} FROM tasks WHERE id = ANY(%b) ORDER BY id FOR UPDATE",
    "schedules": "SELECT id FROM schedules WHERE id = ANY(%b) ORDER BY id FOR UPDATE",
}


def _scan_sql(
    table: str, columns: str, states: bool, tags_column: str | None, tags: bool, after: bool
) -> str:
    where: list[str] = []
    if after:
        where.append("id > %(after)s")
    if states:
        where.append("state = ANY(%(states)s)")
    if tags_column is not None and tags:
        # jsonb containment of a flat string map is "every pair is present"; any key
        # works (quotes, dots, colons), as with SQLite's json_each.
        where.append(f"{tags_column}::jsonb @> %(tags)s::jsonb")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {columns} FROM {table}{clause} ORDER BY id LIMIT %(limit)s"


@functools.cache
def _scan(table: str, states: bool, tags: bool, after: bool) -> str:
    if table == "promises":
        return _scan_sql(table, _PROMISE_COLS, states, "tags", tags, after)
    if table == "tasks":
        return _scan_sql(table, _TASK_COLS, states, None, False, after)
    return _scan_sql(table, _SCHEDULE_COLS, False, "promise_tags", tags, after)


def _after(after: str | None) -> str | None:
    """``id > after`` for stored ids, which never contain U+0000.

    For such an id, ``id > a + NUL + rest`` holds exactly when ``id > a``, so the
    cursor is cut at its first NUL (PostgreSQL cannot even receive one).
    """
    return None if after is None else after.split(_NUL, 1)[0]


def _tags_filter(tags: Tags) -> str | None:
    """The jsonb filter text, or None when no stored row can match (a NUL in it)."""
    if any(_NUL in k or _NUL in v for k, v in tags.items()):
        return None
    return _json(tags)


# -- rows <-> records ------------------------------------------------------------------------


def _promise_row(p: Promise) -> tuple[Any, ...]:
    return (
        p.id,
        p.state,
        _json(p.param),
        _json(p.value),
        _json(p.tags),
        p.timeout_at,
        p.created_at,
        p.settled_at,
        _json(p.callbacks),
        _json(p.listeners),
        p.external,
        p.tags.get(TAG_BRANCH) or None,
        p.state != PENDING and bool(p.callbacks or p.listeners),
    )


def _promise(r: Sequence[Any]) -> Promise:
    return Promise(
        r[0],
        r[1],
        _decode_value(r[2]),
        _decode_value(r[3]),
        _decode_tags(r[4]),
        r[5],
        r[6],
        r[7],
        _decode_strs(r[8]),
        _decode_strs(r[9]),
    )


def _task_row(t: Task) -> tuple[Any, ...]:
    return (t.id, t.state, t.version, t.ttl, t.pid, t.expires_at, t.retry_at, _json(t.resumes))


def _task(r: Sequence[Any]) -> Task:
    return Task(r[0], r[1], r[2], r[3], r[4], r[5], r[6], _decode_strs(r[7]))


def _schedule_row(s: Schedule) -> tuple[Any, ...]:
    return (
        s.id,
        s.cron,
        s.promise_id,
        s.promise_timeout,
        _json(s.promise_param),
        _json(s.promise_tags),
        s.created_at,
        s.next_run_at,
        s.last_run_at,
    )


def _schedule(r: Sequence[Any]) -> Schedule:
    return Schedule(
        r[0], r[1], r[2], r[3], _decode_value(r[4]), _decode_tags(r[5]), r[6], r[7], r[8]
    )


def _message_row(key: str, entry: OutboxEntry, now: int) -> dict[str, Any]:
    m = entry.message
    if isinstance(m, Execute):
        kind, task_id, version, promise = "execute", m.task_id, m.version, None
    else:
        kind, task_id, version, promise = "unblock", None, None, _json(m.promise)
    poll = parse_poll(entry.address)
    return {
        "key": key,
        "address": entry.address,
        "kind": kind,
        "task_id": task_id,
        "version": version,
        "promise": promise,
        "now": now,
        "cast": poll and poll.cast,
        "group": poll and poll.group,
        "dest": poll and poll.id,
    }


def _outbox_row(r: Sequence[Any]) -> OutboxRow:
    """A stored outbox row (columns in ``_OUTBOX_COLUMNS`` order) as an OutboxRow."""
    if r[2] == "execute":
        message: Execute | Unblock = Execute(r[3], r[4])
    else:
        message = Unblock(_decode_record(r[5]))
    return OutboxRow(
        id=r[0],
        entry=OutboxEntry(r[1], message),
        created_at=r[6],
        state=r[7],
        attempts=r[8],
        available_at=r[9],
        claim_token=r[10],
        claimed_by=r[11],
        claimed_at=r[12],
        last_code=r[13],
        updated_at=r[14],
    )


def _pipelined(cur: Cur, statements: Sequence[tuple[str, Any]]) -> None:
    """Execute in one round trip; raise the first statement error, as is.

    psycopg may report a failed statement while later ones are still being queued;
    raised inside the ``pipeline()`` block, that makes its exit log a warning
    (``error ignored terminating``) on a path that is routine here (a conflict that
    re-runs the batch).  So the error is held until the pipeline is closed.
    """
    first: psycopg.Error | None = None
    try:
        with cur.connection.pipeline():
            try:
                for sql, params in statements:
                    cur.execute(sql, params)
            except psycopg.Error as exc:
                first = exc
    except psycopg.Error as exc:
        first = first or exc
    if first is not None:
        raise first


# -- the backend -----------------------------------------------------------------------------


class PostgresBackend(Backend):
    """Reads and writes of one transaction; :meth:`PostgresStore.begin` makes a new one.

    ``seen_*`` maps every id a point read looked up to whether it was there (and
    is now locked).  ``False`` is a promise this transaction relies on: the row
    must not appear (see the module docstring).
    """

    def __init__(self, cur: Cur, *, defer: bool = False) -> None:
        self.cur = cur
        self.seen_promises: dict[str, bool] = {}
        self.seen_tasks: dict[str, bool] = {}
        self.seen_schedules: dict[str, bool] = {}
        #: Every id this transaction looked up or wrote, per table, found or not: what
        #: a re-run locks up front (including the row a failed statement waited for).
        self.touched: Touched = {table: set() for table in _TABLES}
        #: Rows this transaction holds locked, as it last read or wrote them (None:
        #: absent).  A read served from here costs no round trip; the lock makes it
        #: as current as a fresh SELECT would be.
        self.promises: dict[str, Promise | None] = {}
        self.tasks: dict[str, Task | None] = {}
        #: With ``defer``, writes wait here and go out in one pipeline before the next
        #: statement that must see them (a read the cache cannot answer, a scan) or at
        #: COMMIT: a batch of jobs costs a few round trips instead of several per job.
        self.defer = defer
        #: Deferred writes, coalesced: the last row written per id (and whether its
        #: first write in the batch was an INSERT), schedule statements in order,
        #: the last message per key in emission order.
        self.pending_promises: dict[str, tuple[tuple[Any, ...], bool]] = {}
        self.pending_tasks: dict[str, tuple[tuple[Any, ...], bool]] = {}
        self.pending_schedules: list[tuple[str, Any]] = []
        self.pending_messages: dict[str, dict[str, Any]] = {}

    @staticmethod
    def _seen(seen: dict[str, bool], kind: str, id: str, found: bool) -> None:
        if found and seen.get(id) is False:
            raise Phantom(f"{kind} {id!r} appeared after this transaction read it as absent")
        seen[id] = found

    # -- reads ------------------------------------------------------------------------

    def flush(self) -> None:
        """Send the deferred writes (one round trip).

        A failure that a re-run cannot cure cannot be pinned on the job whose write
        caused it (they were sent together): :class:`_FlushFailed` asks the store to
        run the batch again writing job by job.
        """
        statements = self._pending_statements()
        if statements:
            try:
                if len(statements) == 1:
                    self.cur.execute(*statements[0])
                else:
                    _pipelined(self.cur, statements)
            except psycopg.Error as exc:
                conn = self.cur.connection
                if exc.sqlstate in _RETRY_SQLSTATES or conn.closed or conn.broken:
                    raise
                raise _FlushFailed() from exc

    def _pending_statements(self) -> list[tuple[str, Any]]:
        statements: list[tuple[str, Any]] = []
        for pending, insert, upsert, numeric in (
            (self.pending_promises, _INSERT_PROMISES, _UPSERT_PROMISES, _NUMERIC_P),
            (self.pending_tasks, _INSERT_TASKS, _UPSERT_TASKS, _NUMERIC_T),
        ):
            for sql, new in ((insert, True), (upsert, False)):
                rows = [row for id, (row, fresh) in sorted(pending.items()) if fresh is new]
                if rows:
                    statements.append((sql, _columns(rows, numeric)))
            pending.clear()
        statements += self.pending_schedules
        self.pending_schedules = []
        if self.pending_messages:
            messages = list(self.pending_messages.values())
            self.pending_messages = {}
            columns = [
                [None if m[f] is None else str(m[f]) for m in messages] for f in _MESSAGE_FIELDS
            ]
            statements.append((_UPSERT_MESSAGES, columns))
        return statements

    def prefetch(self, ids: Touched) -> None:
        """Lock and read, in one round trip, the rows of ``ids``: the ids the batch's
        requests name (first attempt) or every row earlier attempts touched (a re-run).
        Later point reads of them are served from memory (schedules are only locked).

        Table by table in sorted id order, waiting as long as it takes: every batch
        takes these locks in the same global order, so no cycle can form among them.
        Rows the batch reaches beyond this set are locked as the machine reads them,
        under the usual ``lock_timeout``; a cycle through one of those ends when that
        wait times out, and the next attempt locks a larger set up front.
        """
        self.flush()
        conn = self.cur.connection
        reads: dict[str, Cur] = {}
        try:
            # One cursor per result: in a pipeline, results are read after the sync.
            # The tables' statistics lag behind fast growth (autovacuum analyses them
            # later), and with stale ones the planner scans the whole table for an
            # id list; these are primary-key lookups, so the index is always right.
            with conn.pipeline():
                self.cur.execute("SET LOCAL lock_timeout = 0")
                self.cur.execute("SET LOCAL enable_seqscan = off")
                for table in _TABLES:
                    if ids[table]:
                        reads[table] = conn.cursor()
                        reads[table].execute(_PRELOCK[table], (sorted(ids[table]),))
                self.cur.execute("SET LOCAL enable_seqscan = on")
                self.cur.execute(f"SET LOCAL lock_timeout = {self.lock_timeout_ms}")
            found = {table: c.fetchall() for table, c in reads.items()}
        finally:
            for c in reads.values():
                c.close()
        for table in _TABLES:
            self.touched[table] |= ids[table]
        promises = {r[0]: _promise(r) for r in found.get("promises", ())}
        for id in ids["promises"]:
            p = promises.get(id)
            self._seen(self.seen_promises, "promise", id, p is not None)
            self.promises[id] = p
        tasks = {r[0]: _task(r) for r in found.get("tasks", ())}
        for id in ids["tasks"]:
            t = tasks.get(id)
            self._seen(self.seen_tasks, "task", id, t is not None)
            self.tasks[id] = t

    #: Set by the store: the session's lock_timeout, restored after a prefetch.
    lock_timeout_ms = 50

    def get_promise(self, id: str) -> Promise | None:
        if _NUL in id:
            return None
        if id in self.promises:
            return self.promises[id]
        self.flush()
        self.touched["promises"].add(id)
        r = self.cur.execute(_GET_PROMISE, (id,)).fetchone()
        self._seen(self.seen_promises, "promise", id, r is not None)
        p = None if r is None else _promise(r)
        self.promises[id] = p
        return p

    def get_task(self, id: str) -> Task | None:
        if _NUL in id:
            return None
        if id in self.tasks:
            return self.tasks[id]
        self.flush()
        self.touched["promises"].add(id)
        self.touched["tasks"].add(id)
        r = self.cur.execute(_GET_TASK, {"id": id}).fetchone()
        self._seen(self.seen_tasks, "task", id, r is not None)
        t = None if r is None else _task(r)
        self.tasks[id] = t
        return t

    def get_schedule(self, id: str) -> Schedule | None:
        if _NUL in id:
            return None
        self.flush()
        self.touched["schedules"].add(id)
        r = self.cur.execute(_GET_SCHEDULE, (id,)).fetchone()
        self._seen(self.seen_schedules, "schedule", id, r is not None)
        return None if r is None else _schedule(r)

    def _scan_rows(
        self,
        table: str,
        states: Collection[str] | None,
        tags: Tags,
        after: str | None,
        limit: int,
    ) -> list[tuple[Any, ...]] | None:
        """Rows of one scan; None when no stored row can match the filter."""
        self.flush()
        params: dict[str, Any] = {"limit": limit, "after": _after(after)}
        if states is not None:
            params["states"] = [s for s in states if _NUL not in s]
            if not params["states"]:
                return None
        if tags:
            params["tags"] = _tags_filter(tags)
            if params["tags"] is None:
                return None
        sql = _scan(table, states is not None, bool(tags), after is not None)
        return self.cur.execute(sql, params).fetchall()

    def scan_promises(
        self, states: Collection[str] | None, tags: Tags, after: str | None, limit: int
    ) -> list[Promise]:
        found = self._scan_rows("promises", states, tags, after, limit)
        return [] if found is None else [_promise(r) for r in found]

    def scan_tasks(
        self, states: Collection[str] | None, after: str | None, limit: int
    ) -> list[Task]:
        found = self._scan_rows("tasks", states, {}, after, limit)
        return [] if found is None else [_task(r) for r in found]

    def scan_schedules(self, tags: Tags, after: str | None, limit: int) -> list[Schedule]:
        found = self._scan_rows("schedules", None, tags, after, limit)
        return [] if found is None else [_schedule(r) for r in found]

    def promises_in_branch(self, branch: str, limit: int) -> list[Promise]:
        if not branch or _NUL in branch:
            return []  # the empty branch is never indexed (memory.py: ``if branch:``)
        self.flush()
        return [_promise(r) for r in self.cur.execute(_BRANCH, (branch, limit))]

    # -- deadlines (SKIP LOCKED: another node is already firing those) -----------------

    def _ids(self, sql: str, params: Any) -> list[str]:
        self.flush()
        return [r[0] for r in self.cur.execute(sql, params)]

    def due_promises(self, now: int, limit: int) -> list[str]:
        """Due ids; the rows come along (locked) and serve the timer's next reads."""
        self.flush()
        found = [_promise(r) for r in self.cur.execute(_DUE_PROMISES, (now, limit))]
        for p in found:
            self.touched["promises"].add(p.id)
            self._seen(self.seen_promises, "promise", p.id, True)
            self.promises.setdefault(p.id, p)
        return [p.id for p in found]

    def due_tasks(self, now: int, limit: int) -> list[str]:
        """As :meth:`due_promises`; the task's promise is locked when it is read."""
        self.flush()
        params = {"now": now, "limit": limit}
        found = [_task(r) for r in self.cur.execute(_DUE_TASKS, params)]
        for t in found:
            self.touched["tasks"].add(t.id)
            self._seen(self.seen_tasks, "task", t.id, True)
            self.tasks.setdefault(t.id, t)
        return [t.id for t in found]

    def due_schedules(self, now: int, limit: int) -> list[str]:
        return self._ids(_DUE_SCHEDULES, (now, limit))

    def undrained_promises(self, limit: int) -> list[str]:
        return self._ids(_UNDRAINED, (limit,))

    def next_deadline(self) -> int | None:
        self.flush()
        row = self.cur.execute(_NEXT_DEADLINE).fetchone()
        assert row is not None
        undrained, *armed = row
        candidates: list[int] = [d for d in armed if d is not None]
        if undrained:
            candidates.append(0)
        return min(candidates) if candidates else None

    # -- writes -------------------------------------------------------------------------

    def apply(self, writes: Writes, now: int) -> None:
        """Write one job's effects, all statements in one round trip.

        A row this transaction read as absent is INSERTed (a unique violation means
        another node created it: the batch re-runs); any other row is upserted.
        """
        _refuse_nul(writes)
        self.touched["promises"].update(writes.promises)
        self.touched["tasks"].update(writes.tasks)
        self.touched["schedules"].update(writes.schedules)
        seen_p, seen_t, seen_s = self.seen_promises, self.seen_tasks, self.seen_schedules
        if self.defer:
            self._defer(writes, now)
        else:
            statements: list[tuple[str, Any]] = []
            for id in sorted(writes.promises):
                sql = _INSERT_PROMISE if seen_p.get(id) is False else _UPSERT_PROMISE
                statements.append((sql, _promise_row(writes.promises[id])))
            for id in sorted(writes.tasks):
                sql = _INSERT_TASK if seen_t.get(id) is False else _UPSERT_TASK
                statements.append((sql, _task_row(writes.tasks[id])))
            statements += self._schedule_statements(writes)
            for key, entry in writes.messages.items():
                statements.append((_UPSERT_MESSAGE, _message_row(key, entry, now)))
            if len(statements) == 1:
                self.cur.execute(*statements[0])
            else:
                _pipelined(self.cur, statements)
        # Only now (nothing failed, or deferred) do the written rows count as this
        # transaction's, and later reads see them as written.
        for id, p in writes.promises.items():
            seen_p[id] = True
            self.promises[id] = p
        for id, t in writes.tasks.items():
            seen_t[id] = True
            self.tasks[id] = t
        for id, s in writes.schedules.items():
            seen_s[id] = s is not None

    def _schedule_statements(self, writes: Writes) -> list[tuple[str, Any]]:
        """One statement per schedule written (schedules are rare: never coalesced)."""
        statements: list[tuple[str, Any]] = []
        for id in sorted(writes.schedules):
            s = writes.schedules[id]
            if s is None:
                statements.append((_DELETE_SCHEDULE, (id,)))
            else:
                sql = _INSERT_SCHEDULE if self.seen_schedules.get(id) is False else _UPSERT_SCHEDULE
                statements.append((sql, _schedule_row(s)))
        return statements

    def _defer(self, writes: Writes, now: int) -> None:
        """Queue one job's writes, coalesced with the batch's earlier ones."""
        for id, p in writes.promises.items():
            earlier = self.pending_promises.get(id)
            insert = earlier[1] if earlier else self.seen_promises.get(id) is False
            self.pending_promises[id] = (_promise_row(p), insert)
        for id, t in writes.tasks.items():
            earlier = self.pending_tasks.get(id)
            insert = earlier[1] if earlier else self.seen_tasks.get(id) is False
            self.pending_tasks[id] = (_task_row(t), insert)
        self.pending_schedules += self._schedule_statements(writes)
        for key, entry in writes.messages.items():
            self.pending_messages.pop(key, None)  # a newer message goes to the back
            self.pending_messages[key] = _message_row(key, entry, now)

    # -- whole-store reads -----------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything, in memory.py's ``snapshot()`` format (built from the same Structs)."""
        self.flush()
        q = self.cur.execute
        return snapshot(
            [
                _promise(r)
                for r in q(f"SELECT {_PROMISE_COLS} FROM promises ORDER BY id").fetchall()
            ],
            [_task(r) for r in q(f"SELECT {_TASK_COLS} FROM tasks ORDER BY id").fetchall()],
            [
                _schedule(r)
                for r in q(f"SELECT {_SCHEDULE_COLS} FROM schedules ORDER BY id").fetchall()
            ],
            [_outbox_row(r) for r in q(f"{_SELECT_OUTBOX} ORDER BY id").fetchall()],
        )


# -- migrations -------------------------------------------------------------------------------

#: ``pg_advisory_xact_lock`` key that serialises migrations across nodes ("troth").
_MIGRATION_LOCK: Final = 0x74726F7468
_CREATE_VERSION_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS schema_version ("
    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)"
)


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """Every ``pgsql/NNN_name.sql`` shipped with the package, in version order
    (numbered 1..N without gaps, as for SQLite)."""
    return load_migrations("pgsql")


def latest_version() -> int:
    return len(migrations())


def stored_version(cur: Cur) -> int:
    """The database's schema version; 0 when it has none (a fresh database)."""
    exists = cur.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()
    if exists is None or not exists[0]:
        return 0
    row = cur.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0]) if row is not None and row[0] is not None else 0


def check_version(cur: Cur) -> int:
    found = stored_version(cur)
    if found > latest_version():
        raise SchemaTooNew(found, latest_version())
    return found


def migrate(conn: Conn) -> int:
    """Bring the schema up to date; return the version.  Safe with concurrent nodes.

    A newer schema is refused before anything is written.  Each migration runs in
    its own transaction holding a transaction-level advisory lock, and re-reads the
    version under it: a node that started at the same time waits, then finds the
    work done.  (The lock comes first because even ``CREATE TABLE IF NOT EXISTS``
    fails when two sessions race on it.)  DDL is transactional here, so a failing
    migration leaves the previous version behind.
    """
    cur = conn.cursor()
    try:
        found = check_version(cur)
        conn.rollback()
        for migration in migrations():
            if found >= migration.version:
                continue
            # Waiting for another node's migration is expected: no lock_timeout here.
            cur.execute("SET LOCAL lock_timeout = 0")
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            cur.execute(_CREATE_VERSION_TABLE)
            found = check_version(cur)
            if found < migration.version:
                cur.execute(migration.sql, prepare=False)
                cur.execute(
                    "INSERT INTO schema_version (version, name, applied_at) VALUES (%s, %s, %s)",
                    (migration.version, migration.name, time.time_ns() // 1_000_000),
                )
                found = migration.version
            conn.commit()
        return found
    except BaseException:
        conn.rollback()
        raise
    finally:
        cur.close()


# -- the store ---------------------------------------------------------------------------------


class Session:
    """One PostgreSQL connection, used by one thread at a time (under :attr:`lock`).

    It reconnects when the connection was lost (nothing of an unfinished transaction
    was acknowledged), and :meth:`run` re-runs a transaction that met a conflict.
    The store is one session (the writer's); its outbox lifecycle is another.
    """

    application_name = "troth"
    #: Session settings sent after connecting (``SET …``).
    settings: tuple[str, ...] = ()

    def __init__(self, url: str, *, max_attempts: int, lock_timeout: float) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if lock_timeout <= 0:
            raise ValueError("lock_timeout must be > 0 (seconds)")
        self.url = url
        self.max_attempts = max_attempts
        self.lock_timeout = lock_timeout
        self.lock = threading.Lock()
        #: Transactions re-run after a conflict.
        self.retries = 0
        self.conn = self._connect()
        self.cur: Cur = self.conn.cursor()

    def _connect(self) -> Conn:
        params = conninfo_to_dict(self.url)
        params.setdefault("connect_timeout", 10)
        params.setdefault("application_name", self.application_name)
        conn = psycopg.connect(make_conninfo("", **params), autocommit=False)
        try:
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            conn.adapters.register_loader("numeric", _IntLoader)
            # A session setting (it outlives the transaction that SET it).
            conn.execute(f"SET lock_timeout = {round(self.lock_timeout * 1000)}")
            for setting in self.settings:
                conn.execute(setting)
            conn.commit()
        except BaseException:
            conn.close()
            raise
        return conn

    def _fresh(self) -> None:
        """Ready for a new transaction: reconnect if the connection was lost, roll
        back whatever an interrupted caller left open."""
        if self.conn.closed or self.conn.broken:
            self._reconnect()
        elif self.conn.info.transaction_status != TransactionStatus.IDLE:
            self.conn.rollback()

    def _reconnect(self) -> None:
        try:
            self.conn.close()
        except psycopg.Error:
            pass
        self.conn = self._connect()
        self.cur = self.conn.cursor()

    def rollback(self) -> None:
        """Best effort: never raises, so the error that caused it is what callers see."""
        try:
            if not self.conn.closed:
                self.conn.rollback()
        except psycopg.Error:
            pass

    def _transient(self, exc: BaseException) -> bool:
        """Whether re-running the whole transaction (before COMMIT) is the answer."""
        if isinstance(exc, Phantom):
            return True
        if isinstance(exc, psycopg.Error) and exc.sqlstate in _RETRY_SQLSTATES:
            return True
        return isinstance(exc, psycopg.Error) and (self.conn.closed or self.conn.broken)

    def _backoff(self, failures: int) -> None:
        time.sleep(random.uniform(0, min(MAX_BACKOFF, 0.001 * 2**failures)))

    def run(self, fn: Callable[[Cur], T], *, snapshot: bool = False) -> T:
        """One transaction outside group commit (the outbox lifecycle, reset, snapshot),
        re-run on conflicts like a batch; ``snapshot`` makes it one REPEATABLE READ view.
        """
        with self.lock:
            try:
                return self._run(fn, snapshot)
            except psycopg.OperationalError as exc:
                raise StoreUnavailable(f"postgres unreachable: {exc}") from exc

    def _run(self, fn: Callable[[Cur], T], snapshot: bool) -> T:
        failures = 0
        while True:
            self._fresh()
            try:
                if snapshot:
                    self.cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                value = fn(self.cur)
            except Exception as exc:
                self.rollback()
                failures += 1
                if not self._transient(exc) or failures >= self.max_attempts:
                    raise
                self.retries += 1
                self._backoff(failures)
                continue
            try:
                self.conn.commit()
            except BaseException:
                self.rollback()
                raise
            return value

    def close(self) -> None:
        with self.lock:
            self.conn.close()


class PostgresStore(Session, Store):
    """A PostgreSQL database shared by any number of troth processes.

    ``url`` is a libpq connection string or URI.  The schema is created or
    upgraded on open (see :func:`migrate`).
    """

    name = "postgres"
    shared = True
    outbox: PostgresOutbox

    def __init__(
        self, url: str, *, max_attempts: int = MAX_ATTEMPTS, lock_timeout: float = LOCK_TIMEOUT
    ) -> None:
        Store.__init__(self)
        Session.__init__(self, url, max_attempts=max_attempts, lock_timeout=lock_timeout)
        #: Batches re-run after a job was set aside (``retries``: after a conflict).
        self.reruns = 0
        try:
            migrate(self.conn)
        except BaseException:
            self.conn.close()
            raise
        self.backend = PostgresBackend(self.cur)
        self.outbox = PostgresOutbox(self)

    # -- transactions --------------------------------------------------------------------

    def begin(self, *, defer: bool = False) -> PostgresBackend:
        """Start a transaction (psycopg sends BEGIN with the first statement).

        Reconnects first if the connection was lost: nothing of an unfinished
        transaction was acknowledged, so starting over is safe.
        """
        self._fresh()
        self.backend = PostgresBackend(self.cur, defer=defer)
        self.backend.lock_timeout_ms = round(self.lock_timeout * 1000)
        return self.backend

    def commit(self) -> None:
        self.conn.commit()

    # Savepoints are part of the Store interface; execute() does not use them (see the
    # module docstring), but they work for a caller that drives a transaction itself.

    def savepoint(self) -> None:
        self.cur.execute("SAVEPOINT troth_job")

    def release(self) -> None:
        self.cur.execute("RELEASE SAVEPOINT troth_job")

    def rollback_to(self) -> None:
        self.cur.execute("ROLLBACK TO SAVEPOINT troth_job")
        self.cur.execute("RELEASE SAVEPOINT troth_job")

    # -- group commit ----------------------------------------------------------------------

    def execute(self, jobs: Sequence[Job[Any]]) -> list[Outcome[Any]]:
        """Group commit as in :meth:`Store.execute`, re-run whole on conflicts.

        Every attempt starts from a new transaction and fresh overlays; a job set
        aside (its reads or writes failed for a reason a re-run cannot cure) keeps
        its error and is skipped by later attempts.  Each such job costs one re-run,
        which does not count against ``max_attempts``.
        """
        with self.lock:
            aside: dict[int, BaseException] = {}
            prelock: Touched | None = None
            failures = 0
            careful = False
            while True:
                try:
                    return self._attempt(jobs, aside, prelock, careful)
                except _Rerun:
                    self.rollback()
                    self.reruns += 1
                except _Careful:
                    self.rollback()
                    self.reruns += 1
                    careful = True
                except _Retry as retry:
                    self.rollback()
                    touched = self.backend.touched
                    if prelock is not None:
                        for table in _TABLES:
                            touched[table] |= prelock[table]
                    prelock = touched
                    failures += 1
                    self.retries += 1
                    if failures >= self.max_attempts:
                        log.warning(
                            "batch of %d lost %d attempts: %s", len(jobs), failures, retry.__cause__
                        )
                        busy = StoreBusy(
                            f"gave up after {failures} conflicting attempts: {retry.__cause__}"
                        )
                        busy.__cause__ = retry.__cause__
                        return [Outcome(error=busy) for _ in jobs]
                    log.debug("batch of %d re-runs after: %s", len(jobs), retry.__cause__)
                    self._backoff(failures)
                except Exception as exc:  # BEGIN or COMMIT failed: nothing to re-run safely
                    self.rollback()
                    if isinstance(exc, psycopg.OperationalError):
                        unavailable = StoreUnavailable(f"postgres unreachable: {exc}")
                        unavailable.__cause__ = exc
                        return [Outcome(error=unavailable) for _ in jobs]
                    return [Outcome(error=exc) for _ in jobs]

    def _attempt(
        self,
        jobs: Sequence[Job[Any]],
        aside: dict[int, BaseException],
        prelock: Touched | None,
        careful: bool,
    ) -> list[Outcome[Any]]:
        backend = self.begin(defer=not careful)
        if prelock is None:
            # First attempt: the ids the requests name, in sorted order (Job.keys).
            keys = {k for i, job in enumerate(jobs) if i not in aside for k in job.keys}
            if keys and not _has_nul(keys):
                prelock = {"promises": keys, "tasks": keys, "schedules": set()}
        if prelock is not None:
            try:
                backend.prefetch(prelock)
            except Exception as exc:
                if self._transient(exc):
                    raise _Retry() from exc
                raise
        outcomes: list[Outcome[Any]] = []
        for i, job in enumerate(jobs):
            if i in aside:
                outcomes.append(Outcome(error=aside[i]))
                continue
            overlay = Overlay(backend)
            try:
                value = job.fn(overlay)
            except _FlushFailed as exc:  # an earlier job's deferred write failed
                raise _Careful() from exc
            except Exception as exc:
                # A failed read that aborted the transaction poisons the whole attempt;
                # a job's own exception (or a client-side refusal) is its alone.
                if self._transient(exc):
                    raise _Retry() from exc
                if self.conn.info.transaction_status == TransactionStatus.INERROR:
                    aside[i] = exc
                    raise _Rerun() from exc
                outcomes.append(Outcome(error=exc))
                continue
            if overlay.writes:
                try:
                    backend.apply(overlay.writes, job.now)
                except Unstorable as exc:  # refused before anything was sent
                    outcomes.append(Outcome(error=exc))
                    continue
                except Exception as exc:  # part of its writes may be in: start over
                    if self._transient(exc):
                        raise _Retry() from exc
                    aside[i] = exc
                    raise _Rerun() from exc
            outcomes.append(Outcome.of(value, overlay.writes))
        try:
            backend.flush()
        except _FlushFailed as exc:
            raise _Careful() from exc
        except Exception as exc:
            if self._transient(exc):
                raise _Retry() from exc
            raise
        try:
            self.commit()
        except psycopg.Error as exc:
            if exc.sqlstate in _RETRY_SQLSTATES:
                raise _Retry() from exc  # refused before it took effect: run again
            # The connection broke while COMMIT was under way: it may have happened.
            raise StoreUnavailable(f"COMMIT failed, its outcome is unknown: {exc}") from exc
        return outcomes

    def reset(self) -> None:
        """Delete every row of every node, and restart outbox ids at 1 (debug only).

        The lock waits for every other transaction on the tables: no lock_timeout.
        """

        def delete_all(cur: Cur) -> None:
            cur.execute("SET LOCAL lock_timeout = 0")
            cur.execute(_RESET, prepare=False)

        self.run(delete_all)

    def snapshot(self) -> dict[str, Any]:
        return self.run(lambda cur: PostgresBackend(cur).snapshot(), snapshot=True)

    def ping(self) -> None:
        # Bounded wait: a wedged batch must make /ready fail, not hang it.
        if not self.lock.acquire(timeout=5):
            raise StoreUnavailable("postgres store is busy (lock not acquired within 5 s)")
        try:
            for attempt in (1, 2):  # a connection found dead is reopened once
                try:
                    self.begin()
                    self.cur.execute("SELECT 1").fetchone()
                    self.conn.rollback()
                    return
                except psycopg.Error as exc:
                    self.rollback()
                    if attempt == 2 or not (self.conn.closed or self.conn.broken):
                        raise StoreUnavailable(f"postgres store unavailable: {exc}") from exc
        finally:
            self.lock.release()

    def close(self) -> None:
        self.outbox.close()
        Session.close(self)

    def schema_version(self) -> int:
        """The stored schema version (for diagnostics and tests)."""

        def read(cur: Cur) -> int:
            return check_version(cur)

        return self.run(read)


class _Retry(Exception):
    """Internal: roll back and run the batch again (the cause is ``__cause__``)."""


class _Rerun(Exception):
    """Internal: a job was set aside; run the batch again without it."""


class _FlushFailed(Exception):
    """Internal: deferred writes failed for a reason a re-run cannot cure."""


class _Careful(Exception):
    """Internal: run the batch again writing job by job, to find the failing job."""


@dataclass(frozen=True)
class Routing:
    """How a node of several claims poll:// rows (set by ``server/cluster.py``).

    ``reach`` answers, from any thread, the groups and ``group/id`` pairs this node
    holds SSE connections for right now; ``timeout_ms`` is how old another node's
    heartbeat may be before its connections stop counting.
    """

    node: str
    timeout_ms: int
    reach: Callable[[], tuple[Sequence[str], Sequence[str]]]


class OutboxSession(Session):
    """The outbox lifecycle's own connection, with ``synchronous_commit = off``.

    Claims and settlements are the dispatcher's bookkeeping, not anything a client
    was told: losing the last few to a database crash is safe.  A lost claim leaves
    the row pending (it is sent again: delivery is at least once, and every message
    tolerates a duplicate); a lost settlement leaves it claimed, and the reaper
    makes it outcome_unknown for reconciliation.  So they need not wait for a WAL
    flush, and they do not queue behind the writer's request batches.
    """

    application_name = "troth-outbox"
    settings = ("SET synchronous_commit = off",)


class PostgresOutbox(OutboxStore):
    """The outbox-row lifecycle (``outbox.rows.OutboxLifecycle``) over the outbox table.

    Row for row what memory.py's ``MemoryOutbox`` does, each call one transaction
    (re-run on conflicts) on a connection of its own (:class:`OutboxSession`, opened
    on first use), so it may run on another thread than the writer's, at the same
    time (:attr:`independent`).  Claims take ``FOR UPDATE SKIP LOCKED``, so
    dispatchers on several nodes split the due rows; settlements lock the row they
    check.  With :attr:`routing` set, a node claims only what it can deliver (see
    ``_CLAIM_ROUTED``).
    """

    #: Safe to call from any thread, concurrently with the store's batches.
    independent = True

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.routing: Routing | None = None
        self._session: OutboxSession | None = None
        self._opening = threading.Lock()

    @property
    def session(self) -> OutboxSession:
        with self._opening:
            if self._session is None:
                store = self.store
                self._session = OutboxSession(
                    store.url, max_attempts=store.max_attempts, lock_timeout=store.lock_timeout
                )
            return self._session

    def run(self, fn: Callable[[Cur], T]) -> T:
        return self.session.run(fn)

    def write(self, fn: Callable[[OutboxTable], T]) -> T:
        routing = self.routing
        return self.run(lambda cur: fn(PostgresOutboxTable(cur, routing)))

    def notify(self, payload: str) -> None:
        """``NOTIFY troth`` on the outbox connection, at once (its own transaction)."""
        self.run(lambda cur: cur.execute(_NOTIFY, (payload,)))

    def close(self) -> None:
        with self._opening:
            if self._session is not None:
                self._session.close()
                self._session = None


class PostgresOutboxTable(OutboxTable):
    """The outbox table on one transaction of the outbox session."""

    def __init__(self, cur: Cur, routing: Routing | None) -> None:
        self.cur = cur
        self.routing = routing

    def claim(self, worker_id: str, now: int, limit: int, token: str) -> list[OutboxRow]:
        params: dict[str, Any] = {"now": now, "limit": limit, "token": token, "worker": worker_id}
        sql = _CLAIM
        routing = self.routing
        if routing is not None:
            groups, pairs = routing.reach()
            params.update(
                node=routing.node,
                timeout=routing.timeout_ms,
                groups=list(groups),
                pairs=list(pairs),
            )
            sql = _CLAIM_ROUTED
        return [_outbox_row(r) for r in self.cur.execute(sql, params).fetchall()]

    def find(self, row_id: int, state: RowState, token: str | None) -> tuple[str, int] | None:
        if token is None:
            found = self.cur.execute(_IN_STATE, (row_id, str(state))).fetchone()
        else:
            found = self.cur.execute(_HELD, (row_id, token)).fetchone()
        return None if found is None else (found[0], found[1])

    def has_pending(self, key: str) -> bool:
        return self.cur.execute(_HAS_PENDING, (key,)).fetchone() is not None

    def finish(
        self, row_id: int, state: RowState, attempts: int, code: str | None, now: int
    ) -> None:
        self.cur.execute(_FINISH, (str(state), attempts, code, now, row_id))

    def requeue(
        self, row_id: int, attempts: int, code: str | None, now: int, available_at: int
    ) -> None:
        """If a request inserts a newer pending row of the key between ``has_pending``
        and this update, the partial unique index refuses it (23505) and the
        transaction re-runs, finding the row this time."""
        self.cur.execute(_REQUEUE, (attempts, code, now, available_at, row_id))

    def finish_many(self, items: Sequence[Settlement]) -> set[int]:
        columns: list[list[Any]] = [[], [], [], [], [], []]
        for s in items:
            for column, value in zip(
                columns,
                (
                    s.row_id,
                    s.token,
                    str(s.state),
                    int(s.state == RowState.FAILED),
                    s.code,
                    str(s.now),
                ),
                strict=True,
            ):
                column.append(value)
        return {r[0] for r in self.cur.execute(_FINISH_MANY, columns).fetchall()}

    def unknown_rows(self, limit: int) -> list[OutboxRow]:
        return [_outbox_row(r) for r in self.cur.execute(_UNKNOWN_ROWS, (limit,)).fetchall()]

    def release_expired(self, cutoff: int, now: int, code: str) -> int:
        return self.cur.execute(_RELEASE_EXPIRED, (code, now, cutoff)).rowcount

    def purge_completed(self, before: int) -> int:
        return self.cur.execute(_PURGE_COMPLETED, (before,)).rowcount

    def next_due(self) -> int | None:
        row = self.cur.execute(_NEXT_DUE).fetchone()
        return None if row is None else row[0]
