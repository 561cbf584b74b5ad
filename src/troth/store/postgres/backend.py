"""One transaction of the PostgreSQL store: locked reads, deferred coalesced writes.

How and why it locks, caches, defers and detects a stale view is in
``docs/architecture.md`` ("PostgreSQL").  Its scans (``scans.py``) and its
flow-control tables (``flow.py``) are classes it inherits: one object holds the
transaction's state, and a call takes the same path as in one class.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Final, TypeVar, cast

import psycopg
from psycopg.pq import TransactionStatus

from troth.protocol.records import EARLIEST, PENDING, Promise, Schedule, Task
from troth.store.base import BatchClaim
from troth.store.postgres.claims import INSERT_CLAIMED_FRESH, MESSAGE_COLUMNS, Reach, claimable
from troth.store.postgres.flow import FlowTables
from troth.store.postgres.rows import (
    CODEC,
    FLAGS_P,
    FLAGS_T,
    Q,
    columns,
    message_row,
    messages_statement,
    refuse_nul,
    traces_statement,
)
from troth.store.postgres.scans import Scans
from troth.store.postgres.session import (
    NUL,
    RERUN_BEFORE_COMMIT,
    CommitFailed,
    Cur,
    FlushFailed,
    Phantom,
    TextArray,
    has_nul,
    pipelined,
)
from troth.store.writes import Writes

V = TypeVar("V", Promise, Task, Schedule)

#: The tables whose rows a batch locks, in the order a re-run locks them.
TABLES: Final = ("promises", "tasks", "schedules")
Touched = dict[str, set[str]]
# ORDER BY before FOR UPDATE: rows are locked in sorted id order.
_PRELOCK: Final = {table: Q[f"prelock_{table}"] for table in TABLES}
#: What a row of each table is called in messages, and its point read and due list
#: (looked up once here, not per read on the request path).
_KIND: Final = {"promises": "promise", "tasks": "task", "schedules": "schedule"}
_GET: Final = {table: Q[f"get_{_KIND[table]}"] for table in TABLES}
#: The point reads of a backend that locks nothing (``locking=False``).
_READ: Final = {table: Q[f"read_{_KIND[table]}"] for table in TABLES}
_DUE: Final = {table: Q[f"due_{table}"] for table in ("promises", "tasks")}


class PostgresBackend(FlowTables, Scans):
    """Reads and writes of one transaction; :meth:`PostgresStore.begin` makes a new one.

    ``seen_*`` maps every id a point read looked up to whether it was there (and
    is now locked).  ``False`` is a promise this transaction relies on: the row
    must not appear ("Absent rows lock nothing", docs/architecture.md).
    """

    def __init__(self, cur: Cur, *, defer: bool = False, locking: bool = True) -> None:
        self.cur = cur
        #: Point reads lock their rows (a request's transaction), or not (a read-only
        #: snapshot off the writer: ``PostgresStore.read_many``).
        self._get = _GET if locking else _READ
        self.seen_promises: dict[str, bool] = {}
        self.seen_tasks: dict[str, bool] = {}
        self.seen_schedules: dict[str, bool] = {}
        self.seen = {
            "promises": self.seen_promises,
            "tasks": self.seen_tasks,
            "schedules": self.seen_schedules,
        }
        #: Every id this transaction looked up or wrote, per table, found or not: what
        #: a re-run locks up front (including the row a failed statement waited for).
        self.touched: Touched = {table: set() for table in TABLES}
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
        #: Deferred ``Writes.traces`` (tracing on), by promise id: the first kept.
        self.pending_traces: dict[str, str] = {}
        self.pending_messages: dict[str, tuple[Any, ...]] = {}
        #: Deferred flow-control statements (``Writes.slots``, ``held``, ``limits``,
        #: ``withdrawn``), in order; sent before the messages, so that a message
        #: withdrawn by one job and written again by a later one stays.
        self.pending_flow: list[tuple[str, Any]] = []
        #: The slots this transaction read or wrote, by task id (None: none).
        self.slots: dict[str, str | None] = {}
        #: Limited groups whose row this transaction locked, with what the lock's read
        #: found (token bucket, turn, slots in use), until its next flow-control write.
        self.flow_state: dict[str, tuple[float, int, int]] = {}

    @staticmethod
    def _seen(seen: dict[str, bool], kind: str, id: str, found: bool) -> None:
        if found and seen.get(id) is False:
            raise Phantom(f"{kind} {id!r} appeared after this transaction read it as absent")
        seen[id] = found

    # -- reads ------------------------------------------------------------------------

    def flush(
        self, *, commit: bool = False, fetch: tuple[str, Any] | None = None, begin: bool = False
    ) -> list[Any] | None:
        """Send the deferred writes (one round trip), with ``fetch`` a statement after
        them whose rows are returned, with ``commit`` the COMMIT, all in the same round
        trip; with ``begin`` (and ``commit``) the next transaction's BEGIN after it
        (:func:`pipelined`).

        A failure that a re-run cannot cure cannot be pinned on the job whose write
        caused it (they were sent together): :class:`FlushFailed` asks the store to
        run the batch again writing job by job (or, with ``fetch``, without it).  With
        ``commit``, an error that did not come from a statement before it (the
        COMMIT's own, or a lost connection: the COMMIT may have happened) is
        :class:`CommitFailed`.
        """
        statements = self._pending_statements()
        conn = self.cur.connection
        try:
            if commit and not statements and fetch is None:
                conn.commit()
            elif commit or fetch is not None:
                return pipelined(self.cur, statements, fetch=fetch, commit=commit, begin=begin)
            elif len(statements) == 1:
                self.cur.execute(*statements[0])
            elif statements:
                pipelined(self.cur, statements)
        except psycopg.Error as exc:
            if commit and (
                conn.closed
                or conn.broken
                or conn.info.transaction_status != TransactionStatus.INERROR
            ):
                raise CommitFailed() from exc
            if exc.sqlstate in RERUN_BEFORE_COMMIT or conn.closed or conn.broken:
                raise
            raise FlushFailed() from exc
        return None

    def _pending_statements(self) -> list[tuple[str, Any]]:
        statements: list[tuple[str, Any]] = []
        for pending, insert, upsert, flags in (
            (self.pending_promises, Q["insert_promises"], Q["upsert_promises"], FLAGS_P),
            (self.pending_tasks, Q["insert_tasks"], Q["upsert_tasks"], FLAGS_T),
        ):
            for sql, new in ((insert, True), (upsert, False)):
                rows = [row for id, (row, fresh) in sorted(pending.items()) if fresh is new]
                if rows:
                    statements.append((sql, columns(rows, flags)))
            pending.clear()
        if self.pending_traces:
            statements.append(traces_statement(self.pending_traces))
            self.pending_traces = {}
        statements += self.pending_schedules
        self.pending_schedules = []
        if self.pending_flow:
            statements += self.pending_flow
            self.pending_flow = []
        if self.pending_messages:
            statements.append(messages_statement(list(self.pending_messages.values())))
            self.pending_messages = {}
        return statements

    def claim_on_insert(
        self, claim: BatchClaim, reach: Reach | None
    ) -> tuple[str, dict[str, Any]] | None:
        """The statement that inserts this batch's messages already claimed by
        ``claim`` (their rows are what it returns), taking them out of the deferred
        writes; None, taking nothing, when a claim right after writing them would not
        take exactly them (:func:`claimable`).  It saves the claim's update of every
        row it just inserted: a statement on the batch's path, and a dead row
        version each (docs/performance-notes.md, "Messages inserted claimed")."""
        rows = list(self.pending_messages.values())
        if not rows or not claimable(rows, claim, reach):
            return None
        self.pending_messages = {}
        params: dict[str, Any] = dict(zip(MESSAGE_COLUMNS, columns(rows), strict=True))
        params.update(now=str(claim.now), token=claim.token, worker=claim.worker_id)
        created = self.pending_tasks
        if all(row[2] == "execute" and created.get(row[3], ((), False))[1] for row in rows):
            return INSERT_CLAIMED_FRESH, params
        return Q["insert_claimed_messages"], params

    def prefetch(self, ids: Touched, *, wait: bool = True) -> None:
        """Lock and read, in one round trip, the rows of ``ids``: the ids the batch's
        requests name (first attempt) or every row earlier attempts touched (a re-run).
        Later point reads of them are served from memory (schedules are only locked).

        Table by table in sorted id order, waiting as long as it takes: every batch
        takes these locks in the same global order, so no cycle can form among them.
        Rows the batch reaches beyond this set are locked as the machine reads them,
        under the usual ``lock_timeout``; a cycle through one of those ends when that
        wait times out, and the next attempt locks a larger set up front.  Without
        ``wait`` (:meth:`read_next`), that usual ``lock_timeout`` bounds these waits
        too.
        """
        self.flush()
        # The tables' statistics lag behind fast growth (autovacuum analyses them
        # later), and with stale ones the planner scans the whole table for an id
        # list; these are primary-key lookups, so the index is always right.
        statements: list[tuple[str, Any]] = []
        if wait:
            statements.append(("SET LOCAL lock_timeout = 0", None))
        statements.append(("SET LOCAL enable_seqscan = off", None))
        at: dict[str, int] = {}  # each locked read's place among the statements
        for table in TABLES:
            if ids[table]:
                at[table] = len(statements)
                statements.append((_PRELOCK[table], (TextArray(sorted(ids[table])),)))
        statements.append(("SET LOCAL enable_seqscan = on", None))
        if wait:
            statements.append((f"SET LOCAL lock_timeout = {self.lock_timeout_ms}", None))
        results = self.cur.run(statements)
        found = {table: results[i] or [] for table, i in at.items()}
        for table in TABLES:
            self.touched[table] |= ids[table]
        promises = {r[0]: CODEC.promise(r) for r in found.get("promises", ())}
        for id in ids["promises"]:
            p = promises.get(id)
            self._seen(self.seen_promises, "promise", id, p is not None)
            self.promises[id] = p
        tasks = {r[0]: CODEC.task(r) for r in found.get("tasks", ())}
        for id in ids["tasks"]:
            t = tasks.get(id)
            self._seen(self.seen_tasks, "task", id, t is not None)
            self.tasks[id] = t

    def read_next(
        self,
        settles: Collection[str] = (),
        *,
        tasks: Collection[str] = (),
        promises: Collection[str] = (),
    ) -> None:
        """Lock and read, in one round trip, what this transaction reads next and does
        not hold yet: the awaiters' (``callbacks``) promises and tasks of the pending
        promises ``settles`` (held; ones a job may settle, ``Job.settles``, so that a
        batch that merely acquires a child does not lock its parent), the tasks
        ``tasks`` (due promises: a timeout settles each with its task) and the
        promises ``promises`` (due tasks: is each still pending?).

        Read one by one, each would be a round trip in the middle of a job; a batch
        that settles the children of a fan-out paid two (the parent's promise, its
        task) per child, a timer pass one per due promise or task
        (docs/performance-notes.md).  Read together, under the usual ``lock_timeout`` — as
        the point reads they replace were (after a due list, in the same order: the
        due row, then the other) — they cost one round trip, and none when every
        row is held."""
        held_p, held_t = self.promises, self.tasks
        waiting = {
            awaiter
            for id in settles
            if (p := held_p.get(id)) is not None and p.state == PENDING
            for awaiter in p.callbacks
        }
        want_p = {id for id in (*waiting, *promises) if id not in held_p}
        want_t = {id for id in (*waiting, *tasks) if id not in held_t}
        if (want_p or want_t) and not (has_nul(want_p) or has_nul(want_t)):
            self.prefetch({"promises": want_p, "tasks": want_t, "schedules": set()}, wait=False)

    def preread(self, ids: Collection[str]) -> None:
        """Read, in one round trip and locking nothing, the promises and tasks of
        ``ids`` (a batch of reads off the writer); later point reads of them are served
        from memory: in a REPEATABLE READ snapshot they cannot change."""
        if not ids or has_nul(ids):
            return
        wanted = TextArray(sorted(ids))
        # As in prefetch: a primary-key lookup even while statistics lag.
        _, promises, tasks, _ = self.cur.run(
            [
                ("SET LOCAL enable_seqscan = off", None),
                (Q["preread_promises"], (wanted,)),
                (Q["preread_tasks"], (wanted,)),
                ("SET LOCAL enable_seqscan = on", None),
            ]
        )
        found_p = {r[0]: CODEC.promise(r) for r in promises or ()}
        found_t = {r[0]: CODEC.task(r) for r in tasks or ()}
        for id in wanted:
            self.promises[id] = found_p.get(id)
            self.tasks[id] = found_t.get(id)

    #: Set by the store: the session's lock_timeout, restored after a prefetch.
    lock_timeout_ms = 50

    def _point(
        self,
        table: str,
        id: str,
        params: Any,
        decode: Callable[[Sequence[Any]], V],
        held: dict[str, V | None] | None,
    ) -> V | None:
        """One point read (``get_<kind>`` of queries.sql), locking the row; ``held``
        serves repeat reads of rows this transaction holds, and keeps the answer."""
        if NUL in id:
            return None  # never stored (refuse_nul)
        if held is not None and id in held:
            return held[id]
        self.flush()
        self.touched[table].add(id)
        r = self.cur.execute(self._get[table], params).fetchone()
        self._seen(self.seen[table], _KIND[table], id, r is not None)
        found = None if r is None else decode(r)
        if held is not None:
            held[id] = found
        return found

    def get_promise(self, id: str) -> Promise | None:
        return self._point("promises", id, (id,), CODEC.promise, self.promises)

    def get_trace(self, id: str) -> str | None:
        """Not locked, and not flushed first: a promise whose insert is still deferred
        was written by a job of this batch, whose trace (if it had one) is deferred
        with it."""
        pending = self.pending_traces.get(id)
        if pending is not None or NUL in id:
            return pending
        r = self.cur.execute(Q["get_trace"], (id,)).fetchone()
        return None if r is None else cast(str | None, r[0])

    def get_task(self, id: str) -> Task | None:
        if id not in self.tasks:
            self.touched["promises"].add(id)  # its promise is locked first (queries.sql)
        return self._point("tasks", id, {"id": id}, CODEC.task, self.tasks)

    def get_schedule(self, id: str) -> Schedule | None:
        return self._point("schedules", id, (id,), CODEC.schedule, None)

    # -- deadlines (SKIP LOCKED: another node is already firing those) -----------------

    def _ids(self, sql: str, params: Any) -> list[str]:
        self.flush()
        return [r[0] for r in self.cur.execute(sql, params)]

    def _due(
        self,
        table: str,
        params: Any,
        decode: Callable[[Sequence[Any]], V],
        held: dict[str, V | None],
    ) -> list[str]:
        """A due list (``due_<table>``, SKIP LOCKED); its rows come along, locked, and
        serve the timer's next reads."""
        self.flush()
        ids: list[str] = []
        for r in self.cur.execute(_DUE[table], params):
            row = decode(r)
            self.touched[table].add(row.id)
            self._seen(self.seen[table], _KIND[table], row.id, True)
            held.setdefault(row.id, row)
            ids.append(row.id)
        return ids

    # ``since`` bounds each due list from below: while a snapshot holds the horizon
    # back, a deadline index's low end fills with the dead entries of every row that
    # left it, and a list from the bottom walked them all in the writer's batch.

    def due_promises(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        params = (now, since, limit)
        ids = self._due("promises", params, CODEC.promise, self.promises)
        self.read_next(ids, tasks=ids)
        return ids

    def due_tasks(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        """A due task's promise is read next (:meth:`read_next`); a cycle with a
        request's batch, which locks promise then task, ends at ``lock_timeout``."""
        params = {"now": now, "since": since, "limit": limit}
        ids = self._due("tasks", params, CODEC.task, self.tasks)
        self.read_next(promises=ids)
        return ids

    def due_schedules(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        return self._ids(Q["due_schedules"], (now, since, limit))

    def undrained_promises(self, limit: int) -> list[str]:
        return self._ids(Q["undrained_promises"], (limit,))

    def next_deadline(self, within: tuple[int, int] | None = None) -> int | None:
        """The earliest deadline, or (``within``) the earliest in ``[low, high]``."""
        self.flush()
        if within is None:
            row = self.cur.execute(Q["next_deadline"]).fetchone()
        else:
            low, high = within
            params = {"low": low, "high": high}
            row = self.cur.execute(Q["next_deadline_within"], params).fetchone()
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
        refuse_nul(writes)
        self.touched["promises"].update(writes.promises)
        self.touched["tasks"].update(writes.tasks)
        self.touched["schedules"].update(writes.schedules)
        seen_p, seen_t, seen_s = self.seen_promises, self.seen_tasks, self.seen_schedules
        if self.defer:
            self._defer(writes, now)
        else:
            statements: list[tuple[str, Any]] = []
            for id in sorted(writes.promises):
                sql = Q["insert_promise"] if seen_p.get(id) is False else Q["upsert_promise"]
                statements.append((sql, CODEC.promise_row(writes.promises[id])))
            for id in sorted(writes.tasks):
                sql = Q["insert_task"] if seen_t.get(id) is False else Q["upsert_task"]
                statements.append((sql, CODEC.task_row(writes.tasks[id])))
            if writes.traces:
                statements.append(traces_statement(writes.traces))
            statements += self._schedule_statements(writes)
            if writes.has_flow():
                statements += self._flow_statements(writes, now)
            if writes.messages:
                held = writes.available_at
                rows = [
                    message_row(key, e, now, held.get(key) if held else None)
                    for key, e in writes.messages.items()
                ]
                statements.append(messages_statement(rows))
            if len(statements) == 1:
                self.cur.execute(*statements[0])
            else:
                pipelined(self.cur, statements)
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
                statements.append((Q["delete_schedule"], (id,)))
            else:
                sql = (
                    Q["insert_schedule"]
                    if self.seen_schedules.get(id) is False
                    else Q["upsert_schedule"]
                )
                statements.append((sql, CODEC.schedule_row(s)))
        return statements

    def _defer(self, writes: Writes, now: int) -> None:
        """Queue one job's writes, coalesced with the batch's earlier ones."""
        for id, p in writes.promises.items():
            earlier = self.pending_promises.get(id)
            insert = earlier[1] if earlier else self.seen_promises.get(id) is False
            self.pending_promises[id] = (CODEC.promise_row(p), insert)
        for id, t in writes.tasks.items():
            earlier = self.pending_tasks.get(id)
            insert = earlier[1] if earlier else self.seen_tasks.get(id) is False
            self.pending_tasks[id] = (CODEC.task_row(t), insert)
        self.pending_schedules += self._schedule_statements(writes)
        if writes.has_flow():
            self.pending_flow += self._flow_statements(writes, now)
        if writes.traces:
            for id, trace in writes.traces.items():
                self.pending_traces.setdefault(id, trace)
        held = writes.available_at
        for key, entry in writes.messages.items():
            self.pending_messages.pop(key, None)  # a newer message goes to the back
            due = held.get(key) if held else None
            self.pending_messages[key] = message_row(key, entry, now, due)

    # -- whole-store reads -----------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything, in the memory store's ``snapshot()`` format (built from the same Structs)."""
        self.flush()
        return CODEC.snapshot(lambda sql: self.cur.execute(sql).fetchall())
