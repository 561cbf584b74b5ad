"""A PostgreSQL connection that reconnects and re-runs transactions on conflicts.

The store's writer is one :class:`Session`; its outbox lifecycle is another.  Why a
transaction is re-run (and when it is not) is in ``docs/architecture.md``
("PostgreSQL").
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final, TypeVar

import psycopg
from psycopg.adapt import Dumper
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import Format, TransactionStatus
from psycopg.types.numeric import IntLoader as NumericInts

from troth.pgwire import TEXT_ARRAY_OID, WireCursor, text_array
from troth.store.faults import StoreUnavailable
from troth.store.postgres.timeouts import server_timeouts, with_timeouts

T = TypeVar("T")

Conn = psycopg.Connection[tuple[Any, ...]]
#: A session's cursor: statements through libpq's pipeline calls (``wire.py``).
Cur = WireCursor

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
RETRY_SQLSTATES: Final = frozenset({"40001", "40P01", "23505", "55P03"})

#: ``query_canceled``.  Besides an operator's cancel, PostgreSQL reports a
#: ``lock_timeout`` that expires just as the wait ends (the timeout's indicator is
#: cleared, the cancel it raised is not) as 57014 "due to user request" instead of
#: 55P03: seen here with several nodes contending for one row.  Before COMMIT nothing
#: of the transaction took effect, so it is re-run as a lock timeout would be — but
#: not a COMMIT or a lone autocommit statement that met it (it may have happened).
CANCELED: Final = "57014"
#: What re-runs a transaction when a statement before its COMMIT failed.
RERUN_BEFORE_COMMIT: Final = RETRY_SQLSTATES | {CANCELED}

NUL: Final = "\x00"


def has_nul(texts: Collection[str]) -> bool:
    return any(NUL in t for t in texts)


class StoreBusy(StoreUnavailable):
    """A batch lost every attempt to concurrent transactions (the jobs get 500)."""


class Phantom(Exception):
    """A row this transaction read as absent exists now: its view is stale."""


class CommitFailed(Exception):
    """A COMMIT sent with the batch's writes failed, or the connection was lost in
    that round trip (``__cause__``): whether it took effect is known only from the
    error's SQLSTATE (a conflict refused it); else it is unknown."""


class FlushFailed(Exception):
    """Deferred writes failed for a reason a re-run cannot cure (the store then runs
    the batch again writing job by job, to find the failing job)."""


class Unstorable(ValueError):
    """A value PostgreSQL cannot store; raised before any statement of the job is sent."""


#: NUMERIC columns hold integers only (scale 0): load them as ``int``, not
#: ``Decimal``, with psycopg's own integer loader — compiled in the binary package,
#: about 1 µs per value less than a Python ``int(bytes(data))`` (a batch's prefetch
#: reads a few hundred of them).
IntLoader: Final = NumericInts


class TextArray(list[Any]):
    """A column of a batch's rows sent as one binary ``text[]`` parameter: items are
    ``str``, ``int`` (sent as decimal text, which the statement casts to NUMERIC) or
    None.  Its own dumper (:class:`TextArrayDumper`) knows the item type up front,
    where psycopg's list dumper looks at the items first: measured, 11 columns of 31
    rows dump in 56–100 µs instead of 140–220 (docs/performance-notes.md)."""


class TextArrayDumper(Dumper):
    """Dumps a :class:`TextArray` in PostgreSQL's binary array format (for a
    statement sent through psycopg; the wire encodes it itself)."""

    format = Format.BINARY
    oid = TEXT_ARRAY_OID  # text[]

    def dump(self, obj: Any) -> bytes:
        return text_array(obj)


# Every connection, the store's and any other (``store/transfer.py``), dumps a
# TextArray with it: the type is troth's own, so nothing else is affected.
psycopg.adapters.register_dumper(TextArray, TextArrayDumper)


def pipelined(
    cur: Cur,
    statements: Sequence[tuple[str, Any]],
    *,
    fetch: tuple[str, Any] | None = None,
    commit: bool = False,
    begin: bool = False,
) -> list[Any] | None:
    """Execute in one round trip, then ``fetch`` (its rows are returned) and with
    ``commit`` the COMMIT, and with ``begin`` the next transaction's BEGIN; raise the
    first error, as is.

    The COMMIT and the BEGIN go as statements in the pipeline, so that its one sync
    is the one round trip (docs/architecture.md, "Two round trips per batch").  After
    a failed statement PostgreSQL skips the rest of the pipeline, COMMIT included:
    the transaction is then left aborted (``INERROR``), which tells it from a COMMIT
    that failed itself (the transaction is over).
    """
    sent = list(statements)
    if fetch is not None:
        sent.append(fetch)
    if commit:
        sent.append(("COMMIT", None))
        if begin:
            sent.extend(cur.begin_statements())
    results = cur.run(sent)
    return None if fetch is None else results[len(statements)] or []


class Session:
    """One PostgreSQL connection, used by one thread at a time (under :attr:`lock`).

    It reconnects when the connection was lost (nothing of an unfinished transaction
    was acknowledged), and :meth:`run` re-runs a transaction that met a conflict.
    The store is one session (the writer's); its outbox lifecycle is another.
    """

    application_name = "troth"
    #: Settings of this session's transactions (``name = value``): sent once after
    #: connecting (``SET …``), or after each BEGIN (``SET LOCAL …``) with
    #: :attr:`pooled`.
    settings: tuple[str, ...] = ()

    def __init__(
        self, url: str, *, max_attempts: int, lock_timeout: float, pooled: bool = False
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if lock_timeout <= 0:
            raise ValueError("lock_timeout must be > 0 (seconds)")
        self.url = url
        self.max_attempts = max_attempts
        self.lock_timeout = lock_timeout
        #: Behind a pooler in transaction mode: consecutive transactions may run on
        #: different server connections, so nothing is left on one between them —
        #: no prepared statement, no session setting, no statement outside a
        #: transaction that needs one (docs/operations.md, "Behind a connection pooler").
        self.pooled = pooled
        self.lock = threading.Lock()
        #: Transactions re-run after a conflict.
        self.retries = 0
        #: The open transaction ran nothing but its BEGIN (sent with the last COMMIT,
        #: :func:`pipelined`): as fresh as a new one, so :meth:`_fresh` keeps it.
        self.begun = False
        self.conn = self._connect()
        self.cur: Cur = self._cursor()

    def _all_settings(self) -> tuple[str, ...]:
        return (f"lock_timeout = {round(self.lock_timeout * 1000)}", *self.settings)

    def _cursor(self) -> Cur:
        if not self.pooled:
            return WireCursor(self.conn)
        local = [f"SET LOCAL {setting}" for setting in self._all_settings()]
        return WireCursor(self.conn, prepare=False, after_begin=local)

    def _connect(self) -> Conn:
        params = with_timeouts(conninfo_to_dict(self.url))  # timeouts.py
        params.setdefault("application_name", self.application_name)
        conn = psycopg.connect(make_conninfo("", **params), autocommit=False)
        try:
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            conn.adapters.register_loader("numeric", IntLoader)
            conn.prepare_threshold = None  # psycopg's own prepared statements: none
            if not self.pooled:
                # Session settings (they outlive the transaction that SET them), and
                # the server's end of the connection bounded as the client's is
                # (timeouts.py; behind a pooler its own keepalives do that).
                for setting in self._all_settings():
                    conn.execute(f"SET {setting}")
                if (server := server_timeouts(params)) is not None:
                    conn.execute(server)
                conn.commit()
        except BaseException:
            conn.close()
            raise
        return conn

    def _fresh(self) -> None:
        """Ready for a new transaction: reconnect if the connection was lost, roll
        back whatever an interrupted caller left open — but keep a transaction that
        ran nothing but its BEGIN (:attr:`begun`)."""
        begun, self.begun = self.begun, False
        if self.conn.closed or self.conn.broken:
            self._reconnect()
        elif self.conn.info.transaction_status != TransactionStatus.IDLE:
            if begun and self.conn.info.transaction_status == TransactionStatus.INTRANS:
                return
            self.conn.rollback()

    def _reconnect(self) -> None:
        try:
            self.conn.close()
        except psycopg.Error:
            pass
        self.conn = self._connect()
        self.cur = self._cursor()

    def rollback(self) -> None:
        """Best effort: never raises, so the error that caused it is what callers see."""
        self.begun = False
        try:
            if not self.conn.closed:
                self.conn.rollback()
        except psycopg.Error:
            pass

    def _transient(self, exc: BaseException) -> bool:
        """Whether re-running the whole transaction (before COMMIT) is the answer."""
        if isinstance(exc, Phantom):
            return True
        if isinstance(exc, psycopg.Error) and exc.sqlstate in RERUN_BEFORE_COMMIT:
            return True
        return isinstance(exc, psycopg.Error) and (self.conn.closed or self.conn.broken)

    def _backoff(self, failures: int) -> None:
        time.sleep(random.uniform(0, min(MAX_BACKOFF, 0.001 * 2**failures)))

    def run(self, fn: Callable[[Cur], T], *, snapshot: bool = False) -> T:
        """One transaction outside group commit (the outbox lifecycle, reset, snapshot),
        re-run on conflicts like a batch; ``snapshot`` makes it one REPEATABLE READ view.
        """
        return self._locked(lambda: self._run(fn, snapshot))

    def run_single(self, fn: Callable[[Cur], T]) -> T:
        """``fn``, which sends exactly one statement, as a transaction of its own in
        one round trip: in autocommit mode, the statement is its own transaction,
        where :meth:`run` costs three (psycopg's BEGIN, the statement, COMMIT), each
        a wait and a wake-up of the calling thread.  With :attr:`pooled` it is a
        :meth:`run` (two round trips: the statement goes with its BEGIN), since only
        a transaction carries the session's settings there.

        Re-run after a conflict (the statement failed whole: nothing took effect);
        not after a lost connection, when the statement may have committed.
        """
        if self.pooled:
            return self.run(fn)
        return self._locked(lambda: self._run_single(fn))

    def _locked(self, body: Callable[[], T]) -> T:
        """``body`` holding the session's lock; a connection that failed under it is
        :class:`StoreUnavailable` to the caller."""
        with self.lock:
            try:
                return body()
            except psycopg.OperationalError as exc:
                raise StoreUnavailable(f"postgres unreachable: {exc}") from exc

    def _run_single(self, fn: Callable[[Cur], T]) -> T:
        failures = 0
        while True:
            self._fresh()
            conn = self.conn
            conn.autocommit = True
            try:
                return fn(self.cur)
            except psycopg.Error as exc:
                failures += 1
                lost = conn.closed or conn.broken
                if exc.sqlstate not in RETRY_SQLSTATES or lost or failures >= self.max_attempts:
                    raise
            finally:
                if not (conn.closed or conn.broken):
                    conn.autocommit = False
            self.retries += 1
            self._backoff(failures)

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
