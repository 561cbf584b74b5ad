"""One transaction of the PostgreSQL store: locked reads, deferred coalesced writes.

How and why it locks, caches, defers and detects a stale view is in
``docs/architecture.md`` ("PostgreSQL").
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Final, TypeVar, cast

import psycopg
from psycopg.pq import TransactionStatus

from troth.flow.limits import Held, Limit, held_row, limit_row, stored_held, stored_limit
from troth.protocol.records import (
    PENDING,
    TAG_ORIGIN,
    Execute,
    OutboxEntry,
    Promise,
    Schedule,
    Tags,
    Task,
)
from troth.store.base import Backend, BatchClaim
from troth.store.codec import PROMISE_COLS, SCHEDULE_COLS, TASK_COLS, RowCodec, json_text
from troth.store.postgres.session import (
    NUL,
    RERUN_BEFORE_COMMIT,
    CommitFailed,
    Cur,
    FlushFailed,
    Phantom,
    TextArray,
    Unstorable,
    has_nul,
    pipelined,
)
from troth.store.queries import load_queries
from troth.store.writes import Writes

V = TypeVar("V", Promise, Task, Schedule)

Q: Final = load_queries("troth.store.postgres")
CODEC: Final = RowCodec()


def refuse_nul(writes: Writes) -> None:
    """Raise before anything is sent if a value PostgreSQL text cannot hold is written.

    Only text the server stores or parses as such counts: ids, states, tag keys and
    values (searched through ``jsonb``), addresses, keys.  Other JSON columns are
    msgspec text, where U+0000 is escaped.
    """
    # Group by group (no list of them all built first): it runs for every job's writes.
    for p in writes.promises.values():
        _refuse_nul((p.id, p.state))
        _refuse_nul(p.tags)
        _refuse_nul(p.tags.values())
    for t in writes.tasks.values():
        _refuse_nul((t.id, t.state, t.pid or ""))
    for id, s in writes.schedules.items():
        _refuse_nul((id,))
        if s is not None:
            _refuse_nul((s.cron, s.promise_id))
            _refuse_nul(s.promise_tags)
            _refuse_nul(s.promise_tags.values())
    for key, entry in writes.messages.items():
        _refuse_nul((key, entry.address))
        if isinstance(entry.message, Execute):
            _refuse_nul((entry.message.task_id,))


def _refuse_nul(texts: Iterable[str]) -> None:
    """:func:`~troth.store.postgres.session.has_nul` that names the offending text."""
    for text in texts:
        if NUL in text:
            raise Unstorable(f"PostgreSQL text cannot hold U+0000: refusing to store {text!r}")


# The boolean columns of a promise and a task row (codec order): every other column
# goes as ``text[]`` (numbers as exact text, cast to NUMERIC by the statement).
_FLAGS_P: Final = frozenset({10, 12})
_FLAGS_T: Final = frozenset[int]()


def _columns(rows: Sequence[tuple[Any, ...]], flags: frozenset[int] = _FLAGS_T) -> list[list[Any]]:
    """Rows to parallel column arrays: ``text[]`` (:class:`TextArray`) but for the
    boolean columns ``flags`` (none: every column text, as the outbox's)."""
    return [list(c) if i in flags else TextArray(c) for i, c in enumerate(zip(*rows, strict=True))]


def _message_row(
    key: str, entry: OutboxEntry, now: int, available_at: int | None
) -> tuple[Any, ...]:
    """The codec's message row plus its parsed ``poll://`` destination (claims route
    on it: ``claim_routed``)."""
    return CODEC.message_row(key, entry, now, available_at) + CODEC.destination(entry.address)


def _traces_statement(traces: dict[str, str]) -> tuple[str, list[list[Any]]]:
    """One ``set_traces`` for ``Writes.traces`` (ids sorted: the rows' lock order)."""
    ids = sorted(traces)
    return Q["set_traces"], [TextArray(ids), TextArray([traces[id] for id in ids])]


def _messages_statement(rows: Sequence[tuple[Any, ...]]) -> tuple[str, list[list[Any]]]:
    """One ``upsert_messages`` for message rows in emission order (all text arrays)."""
    return Q["upsert_messages"], _columns(rows)


#: The groups and ``group/id`` pairs this node holds SSE connections for, asked from
#: the writer thread (``outbox.Routing.reach``).
Reach = Callable[[], tuple[Sequence[str], Sequence[str]]]

#: A message row's columns (``_message_row`` order), as ``insert_claimed_messages``
#: names its arrays.
_MESSAGE_COLUMNS: Final = (
    "keys", "address", "kind", "task_id", "version", "promise", "created", "due", "cast_",
    "grp", "dest",
)  # fmt: skip


#: ``insert_claimed_messages`` without its delete of the pending rows of the same keys,
#: for a batch whose messages are all the first ``execute`` of a task this transaction
#: creates (an INSERT among its deferred writes): no pending row can have that key
#: (an earlier task of the id took its pending rows along when it was deleted).  The
#: delete is planned over the whole ``pending`` range of ``outbox_state_available``,
#: never the unique key index: while a snapshot holds the horizon back, that range
#: fills with the dead entries of every claim, and the delete walked them in every
#: batch.
_INSERT_CLAIMED_FRESH: Final = Q["insert_claimed_messages"][
    Q["insert_claimed_messages"].index("INSERT INTO outbox") :
]


def _claimable(rows: Sequence[tuple[Any, ...]], claim: BatchClaim, reach: Reach | None) -> bool:
    """Whether a claim made right after these rows were written would take every one
    of them: each due by ``claim.now``, no more than its limit, and each this node's
    to deliver — an http(s) row, or (``reach``: a node of several, ``claim_routed``)
    a poll:// row for a ``group/id`` this node holds, or for any id of a group it
    holds.  Anything else is the claim statement's to decide."""
    if len(rows) > claim.limit:
        return False
    groups: Collection[str] = ()
    pairs: Collection[str] = ()
    if reach is not None and any(row[9] is not None for row in rows):
        held_groups, held_pairs = reach()
        groups, pairs = set(held_groups), set(held_pairs)
    for row in rows:
        if row[7] > claim.now:
            return False
        cast, group, id = row[8], row[9], row[10]
        if reach is None or group is None:
            continue
        if id is not None and f"{group}/{id}" in pairs:
            continue
        if cast == "any" and id is None and group in groups:
            continue
        return False
    return True


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


def _scan_sql(
    table: str,
    columns: str,
    states: bool,
    tags_column: str | None,
    tags: bool,
    after: bool,
    origin: bool = False,
    pending: bool = False,
) -> str:
    """The scan's statement; with ``origin``, the indexed ``origin = …`` comes first
    (the ``resonate:origin`` tag, derived on every write); ``pending`` (the states are
    exactly pending) is written as a literal, which the partial index of pending
    promises matches (a parameter would not, in a generic plan)."""
    where: list[str] = ["origin = %(origin)s"] if origin else []
    if after:
        where.append("id > %(after)s")
    if pending:
        where.append("state = 'pending'")
    elif states:
        where.append("state = ANY(%(states)s)")
    if tags_column is not None and tags:
        # jsonb containment of a flat string map is "every pair is present"; any key
        # works (quotes, dots, colons), as with SQLite's json_each.
        where.append(f"{tags_column}::jsonb @> %(tags)s::jsonb")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {columns} FROM {table}{clause} ORDER BY id LIMIT %(limit)s"


@functools.cache
def _scan(
    table: str, states: bool, tags: bool, after: bool, origin: bool = False, pending: bool = False
) -> str:
    if table == "promises":
        return _scan_sql(table, PROMISE_COLS, states, "tags", tags, after, origin, pending)
    if table == "tasks":
        return _scan_sql(table, TASK_COLS, states, None, False, after)
    return _scan_sql(table, SCHEDULE_COLS, False, "promise_tags", tags, after)


def _after(after: str | None) -> str | None:
    """``id > after`` for stored ids, which never contain U+0000.

    For such an id, ``id > a + NUL + rest`` holds exactly when ``id > a``, so the
    cursor is cut at its first NUL (PostgreSQL cannot even receive one).
    """
    return None if after is None else after.split(NUL, 1)[0]


def _tags_filter(tags: Tags) -> str | None:
    """The jsonb filter text, or None when no stored row can match (a NUL in it)."""
    if any(NUL in k or NUL in v for k, v in tags.items()):
        return None
    return json_text(tags)


class PostgresBackend(Backend):
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
            (self.pending_promises, Q["insert_promises"], Q["upsert_promises"], _FLAGS_P),
            (self.pending_tasks, Q["insert_tasks"], Q["upsert_tasks"], _FLAGS_T),
        ):
            for sql, new in ((insert, True), (upsert, False)):
                rows = [row for id, (row, fresh) in sorted(pending.items()) if fresh is new]
                if rows:
                    statements.append((sql, _columns(rows, flags)))
            pending.clear()
        if self.pending_traces:
            statements.append(_traces_statement(self.pending_traces))
            self.pending_traces = {}
        statements += self.pending_schedules
        self.pending_schedules = []
        if self.pending_flow:
            statements += self.pending_flow
            self.pending_flow = []
        if self.pending_messages:
            statements.append(_messages_statement(list(self.pending_messages.values())))
            self.pending_messages = {}
        return statements

    def claim_on_insert(
        self, claim: BatchClaim, reach: Reach | None
    ) -> tuple[str, dict[str, Any]] | None:
        """The statement that inserts this batch's messages already claimed by
        ``claim`` (their rows are what it returns), taking them out of the deferred
        writes; None, taking nothing, when a claim right after writing them would not
        take exactly them (:func:`_claimable`).  It saves the claim's update of every
        row it just inserted: a statement on the batch's path, and a dead row
        version each (docs/performance-notes.md, "Messages inserted claimed")."""
        rows = list(self.pending_messages.values())
        if not rows or not _claimable(rows, claim, reach):
            return None
        self.pending_messages = {}
        params: dict[str, Any] = dict(zip(_MESSAGE_COLUMNS, _columns(rows), strict=True))
        params.update(now=str(claim.now), token=claim.token, worker=claim.worker_id)
        created = self.pending_tasks
        if all(row[2] == "execute" and created.get(row[3], ((), False))[1] for row in rows):
            return _INSERT_CLAIMED_FRESH, params
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

    # -- flow control ---------------------------------------------------------------

    def flow_limits(self) -> list[Limit]:
        self.flush()
        rows = self.cur.execute(Q["flow_limits"]).fetchall()
        return [stored_limit(*row) for row in rows]

    def flow_tat(self, group: str) -> float:
        state = self.flow_state.get(group)
        if state is not None:
            return state[0]
        self.flush()
        r = self.cur.execute(Q["flow_tat"], (group,)).fetchone()
        return 0.0 if r is None else float(r[0])

    def flow_lock(self, group: str) -> None:
        """Lock the group's row and read its state with it (one round trip); again in
        the same transaction, nothing to send while no flow-control write came since."""
        if group in self.flow_state:
            return
        self.flush()
        r = self.cur.execute(Q["flow_lock"], (group,)).fetchone()
        if r is not None:
            self.flow_state[group] = (float(r[0]), int(r[1]), int(r[2]))

    def flow_place(self, task_id: str, group: str, key: str) -> tuple[Held | None, int]:
        self.flush()
        r = self.cur.execute(Q["flow_place"], (group, group, key, task_id)).fetchone()
        assert r is not None  # one row, always
        queued = None if r[1] is None else stored_held(*r[1:])
        return queued, int(r[0] or 0)

    def flow_slot(self, task_id: str) -> str | None:
        if task_id in self.slots:
            return self.slots[task_id]
        self.flush()
        r = self.cur.execute(Q["flow_slot"], (task_id,)).fetchone()
        found = None if r is None else str(r[0])
        self.slots[task_id] = found
        return found

    def flow_in_use(self, group: str) -> int:
        state = self.flow_state.get(group)
        if state is not None:
            return state[2]
        self.flush()
        return self._count(Q["flow_in_use"], group)

    def flow_slots_of(self, group: str) -> list[str]:
        self.flush()
        return [str(r[0]) for r in self.cur.execute(Q["flow_slots_of"], (group,)).fetchall()]

    def flow_held(self, group: str, limit: int, offset: int = 0) -> list[Held]:
        self.flush()
        rows = self.cur.execute(Q["flow_held"], (group, limit, offset)).fetchall()
        return [stored_held(*row) for row in rows]

    def flow_queued(self, task_id: str) -> Held | None:
        self.flush()
        r = self.cur.execute(Q["flow_queued"], (task_id,)).fetchone()
        return None if r is None else stored_held(*r)

    def flow_key_in_use(self, group: str, key: str) -> int:
        self.flush()
        r = self.cur.execute(Q["flow_key_in_use"], (group, key)).fetchone()
        return 0 if r is None else int(r[0])

    def flow_key_turn(self, group: str, key: str) -> int:
        self.flush()
        r = self.cur.execute(Q["flow_key_turn"], (group, key)).fetchone()
        return 0 if r is None or r[0] is None else int(r[0])

    def flow_turn(self, group: str) -> int:
        state = self.flow_state.get(group)
        if state is not None:
            return state[1]
        self.flush()
        r = self.cur.execute(Q["flow_turn"], (group,)).fetchone()
        return 0 if r is None else int(r[0])

    def flow_held_count(self, group: str) -> int:
        self.flush()
        return self._count(Q["flow_held_count"], group)

    def _count(self, sql: str, group: str) -> int:
        r = self.cur.execute(sql, (group,)).fetchone()
        return 0 if r is None else int(r[0])

    def _flow_statements(self, writes: Writes, now: int) -> list[tuple[str, Any]]:
        self.flow_state.clear()  # counts and buckets change: read them again (locked)
        statements: list[tuple[str, Any]] = []
        for key in sorted(writes.withdrawn or ()):
            self.pending_messages.pop(key, None)
            statements.append((Q["flow_withdraw"], (key,)))
        keys = writes.slot_keys or {}
        for task_id, group in sorted((writes.slots or {}).items()):
            self.slots[task_id] = group
            if group is None:
                statements.append((Q["flow_delete_slot"], (task_id,)))
            else:
                row = (task_id, group, keys.get(task_id, ""))
                statements.append((Q["flow_put_slot"], row))
        for task_id, held in sorted((writes.held or {}).items()):
            if held is None:
                statements.append((Q["flow_delete_held"], (task_id,)))
            else:
                statements.append((Q["flow_put_held"], held_row(held)))
        for group, limit in sorted((writes.limits or {}).items()):
            if limit is None:
                statements.append((Q["flow_delete_limit"], (group,)))
                statements.append((Q["flow_delete_group_slots"], (group,)))
                self.slots = {t: g for t, g in self.slots.items() if g != group}
            else:
                statements.append((Q["flow_put_limit"], limit_row(limit, now)))
        for group, tat in sorted((writes.tats or {}).items()):
            statements.append((Q["flow_put_tat"], (tat, group)))
        for group, turn in sorted((writes.turns or {}).items()):
            statements.append((Q["flow_put_turn"], (turn, group)))
        return statements

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
            params["states"] = [s for s in states if NUL not in s]
            if not params["states"]:
                return None
        origin = tags.get(TAG_ORIGIN) if table == "promises" else None
        if origin is not None:
            if NUL in origin:
                return None
            params["origin"] = origin
            tags = {k: v for k, v in tags.items() if k != TAG_ORIGIN}
        if tags:
            params["tags"] = _tags_filter(tags)
            if params["tags"] is None:
                return None
        pending = table == "promises" and params.get("states") == [PENDING]
        sql = _scan(
            table, states is not None, bool(tags), after is not None, origin is not None, pending
        )
        return self.cur.execute(sql, params).fetchall()

    def scan_promises(
        self, states: Collection[str] | None, tags: Tags, after: str | None, limit: int
    ) -> list[Promise]:
        found = self._scan_rows("promises", states, tags, after, limit)
        return [] if found is None else [CODEC.promise(r) for r in found]

    def scan_tasks(
        self, states: Collection[str] | None, after: str | None, limit: int
    ) -> list[Task]:
        found = self._scan_rows("tasks", states, {}, after, limit)
        return [] if found is None else [CODEC.task(r) for r in found]

    def scan_schedules(self, tags: Tags, after: str | None, limit: int) -> list[Schedule]:
        found = self._scan_rows("schedules", None, tags, after, limit)
        return [] if found is None else [CODEC.schedule(r) for r in found]

    def promises_in_branch(self, branch: str, limit: int) -> list[Promise]:
        if not branch or NUL in branch:
            return []  # the empty branch is never indexed (memory.py: ``if branch:``)
        self.flush()
        return [
            CODEC.promise(r) for r in self.cur.execute(Q["promises_in_branch"], (branch, limit))
        ]

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

    def due_promises(self, now: int, limit: int) -> list[str]:
        ids = self._due("promises", (now, limit), CODEC.promise, self.promises)
        self.read_next(ids, tasks=ids)
        return ids

    def due_tasks(self, now: int, limit: int) -> list[str]:
        """A due task's promise is read next (:meth:`read_next`); a cycle with a
        request's batch, which locks promise then task, ends at ``lock_timeout``."""
        params = {"now": now, "limit": limit}
        ids = self._due("tasks", params, CODEC.task, self.tasks)
        self.read_next(promises=ids)
        return ids

    def due_schedules(self, now: int, limit: int) -> list[str]:
        return self._ids(Q["due_schedules"], (now, limit))

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
                statements.append(_traces_statement(writes.traces))
            statements += self._schedule_statements(writes)
            if writes.has_flow():
                statements += self._flow_statements(writes, now)
            if writes.messages:
                held = writes.available_at
                rows = [
                    _message_row(key, e, now, held.get(key) if held else None)
                    for key, e in writes.messages.items()
                ]
                statements.append(_messages_statement(rows))
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
            self.pending_messages[key] = _message_row(key, entry, now, due)

    # -- whole-store reads -----------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything, in memory.py's ``snapshot()`` format (built from the same Structs)."""
        self.flush()
        return CODEC.snapshot(lambda sql: self.cur.execute(sql).fetchall())
