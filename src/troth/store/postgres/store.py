"""The PostgreSQL store: several troth nodes may share one database.

It answers exactly as the memory and SQLite stores do; what it adds is correctness
when other processes write the same rows at the same time: group commit re-run whole
on conflicts, rows locked in a fixed order, no savepoint per job.  The reasons, and
what is not prevented, are in ``docs/architecture.md`` ("PostgreSQL").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from troth.outbox.rows import OutboxRow
from troth.store.base import BatchClaim, Job, Outcome, Overlay, Store, read_only
from troth.store.faults import StoreFault, StoreUnavailable
from troth.store.inspection import Inspection, SqlInspection
from troth.store.outbox import in_claim_order
from troth.store.postgres.backend import TABLES, PostgresBackend, Touched
from troth.store.postgres.faults import write_refused
from troth.store.postgres.migrate import PgSchema
from troth.store.postgres.outbox import PostgresOutbox, claim_statement, claimed_rows
from troth.store.postgres.rows import CODEC, Q
from troth.store.postgres.session import (
    LOCK_TIMEOUT,
    MAX_ATTEMPTS,
    RETRY_SQLSTATES,
    CommitFailed,
    Cur,
    FlushFailed,
    Session,
    StoreBusy,
    Unstorable,
    has_nul,
)
from troth.store.retention import Retention, SqlRetention
from troth.store.sql.migrate import check_version, migrate

log = logging.getLogger("troth.store.postgres")
#: The write ``probe`` commits: the newest schema_version row, unchanged.
_PROBE = (
    "UPDATE schema_version SET applied_at = applied_at"
    " WHERE version = (SELECT max(version) FROM schema_version)"
)


T = TypeVar("T")

#: Seconds between attempts to reach an unreachable database (``outage_wait``).
OUTAGE_POLL = 0.2


class PostgresStore(Session, Store):
    """A PostgreSQL database shared by any number of troth processes.

    ``url`` is a libpq connection string or URI.  The schema is created or
    upgraded on open (see :func:`migrate`).
    """

    name = "postgres"
    shared = True
    #: Between batches the writer's connection holds a transaction that ran nothing
    #: but its BEGIN (``Session.begun``): a server-wide idle-in-transaction timeout
    #: must not close it (it holds no lock and no snapshot).
    settings = ("idle_in_transaction_session_timeout = 0",)
    uses_keys = True
    deadline_apart = True
    outbox: PostgresOutbox

    def __init__(
        self,
        url: str,
        *,
        max_attempts: int = MAX_ATTEMPTS,
        lock_timeout: float = LOCK_TIMEOUT,
        pooled: bool = False,
        readers: int = 2,
        outage_wait: float = 0.0,
    ) -> None:
        Store.__init__(self)
        Session.__init__(
            self, url, max_attempts=max_attempts, lock_timeout=lock_timeout, pooled=pooled
        )
        #: Connections (and threads) serving read-only requests; 0: the writer's.
        self.readers = readers
        #: Seconds a batch waits for an unreachable database before its requests get
        #: 503 (``postgres_outage_wait``): a failover or restart of a second or two
        #: then costs the clients a slower answer, not a failed request.
        self.outage_wait = outage_wait
        #: Set when a batch waited ``outage_wait`` in vain, cleared by the next batch
        #: that reaches the database: while set, batches do not wait again (a long
        #: outage answers 503 at once, and a request queued behind a waiting batch
        #: waits once, not once per batch ahead of it).
        self.gave_up = False
        self.pooled_reads = readers > 0
        #: Batches re-run after a job was set aside (``retries``: after a conflict).
        self.reruns = 0
        try:
            migrate(PgSchema(self.conn))
            self.conn.rollback()  # the version check's read transaction
        except BaseException:
            self.conn.close()
            raise
        self.backend = PostgresBackend(self.cur)
        self.outbox = PostgresOutbox(self.session_options)
        self._sessions: dict[type[Session], Session] = {}
        self._sessions_opening = threading.Lock()
        #: The reader threads' sessions (``read_many``), one per thread, by thread id.
        self._readers: dict[int, Session] = {}
        #: What the last committed batch claimed (``take_claimed``).
        self._claimed: list[OutboxRow] | None = None

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

    # Savepoints are part of the Store interface; execute() does not use them (see "No
    # savepoint per job", docs/architecture.md), but they work for a caller that drives
    # a transaction itself.

    def savepoint(self) -> None:
        self.cur.execute("SAVEPOINT troth_job")

    def release(self) -> None:
        self.cur.execute("RELEASE SAVEPOINT troth_job")

    def rollback_to(self) -> None:
        self.cur.execute("ROLLBACK TO SAVEPOINT troth_job")
        self.cur.execute("RELEASE SAVEPOINT troth_job")

    # -- group commit ----------------------------------------------------------------------

    def execute(
        self,
        jobs: Sequence[Job[Any]],
        claim_in_batch: Callable[[], BatchClaim | None] | None = None,
    ) -> list[Outcome[Any]]:
        """Group commit as in :meth:`Store.execute`, re-run whole on conflicts.

        Every attempt starts from a new transaction and fresh overlays; a job set
        aside (its reads or writes failed for a reason a re-run cannot cure) keeps
        its error and is skipped by later attempts.  Each such job costs one re-run,
        which does not count against ``max_attempts``.  A batch whose claim failed
        runs again without ``claim_in_batch``.
        """
        with self.lock:
            aside: dict[int, BaseException] = {}
            prelock: Touched | None = None
            failures = 0
            careful = False
            ask = claim_in_batch
            self._claimed = None
            unreachable_since: float | None = None
            while True:
                try:
                    try:
                        outcomes = self._attempt(jobs, aside, prelock, careful, ask)
                    except Exception as exc:
                        fault = write_refused(exc)
                        if fault is None:
                            raise
                        self.rollback()  # full or read-only: no job of it would pass
                        return [Outcome(error=fault) for _ in jobs]
                    self.gave_up = False
                    return outcomes
                except _Rerun:
                    self.rollback()
                    self.reruns += 1
                except _Unclaimed:
                    self.rollback()
                    self.reruns += 1
                    ask = None
                except _Careful:
                    self.rollback()
                    self.reruns += 1
                    careful = True
                except _Retry as retry:
                    self.rollback()
                    touched = self.backend.touched
                    if prelock is not None:
                        for table in TABLES:
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
                        # Not a COMMIT (one cut off is StoreUnavailable, its outcome
                        # unknown): the connection could not be (re)opened, nothing of
                        # the batch took effect, and it may run again once it can.
                        now = time.monotonic()
                        if unreachable_since is None:
                            unreachable_since = now
                        left = unreachable_since + self.outage_wait - now
                        if left > 0 and not self.gave_up:
                            log.debug("waiting for postgres (%.1f s left): %s", left, exc)
                            time.sleep(min(OUTAGE_POLL, left))
                            failures = 0
                            continue
                        self.gave_up = True
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
        ask: Callable[[], BatchClaim | None] | None,
    ) -> list[Outcome[Any]]:
        backend = self.begin(defer=not careful)
        if prelock is None:
            # First attempt: the ids the requests name, in sorted order (Job.keys).
            keys = {k for i, job in enumerate(jobs) if i not in aside for k in job.keys}
            if keys and not has_nul(keys):
                prelock = {"promises": keys, "tasks": keys, "schedules": set()}
        if prelock is not None:
            try:
                backend.prefetch(prelock)
                settling = [k for i, job in enumerate(jobs) if i not in aside for k in job.settles]
                backend.read_next(settling)
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
            except FlushFailed as exc:  # an earlier job's deferred write failed
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
        claim = self._batch_claim(ask, outcomes) if ask is not None and not careful else None
        fetch = None
        if claim is not None:
            routing = self.outbox.routing
            fetch = backend.claim_on_insert(claim, None if routing is None else routing.reach)
            if fetch is None:
                fetch = claim_statement(routing, claim)
        try:
            claimed = backend.flush(commit=True, fetch=fetch, begin=True)
        except FlushFailed as exc:
            if fetch is not None:  # the writes or the claim: again without the claim
                raise _Unclaimed() from exc
            raise _Careful() from exc
        except CommitFailed as failed:
            cause = failed.__cause__
            if isinstance(cause, psycopg.Error) and cause.sqlstate in RETRY_SQLSTATES:
                raise _Retry() from cause  # refused before it took effect: run again
            # The connection broke while COMMIT was under way: it may have happened.
            raise StoreUnavailable(f"COMMIT failed, its outcome is unknown: {cause}") from cause
        except Exception as exc:
            if self._transient(exc):
                raise _Retry() from exc
            raise
        # The next batch's transaction is open already (BEGIN went with the COMMIT):
        # its first statements need not wait for a BEGIN of their own.
        self.begun = self.conn.info.transaction_status == TransactionStatus.INTRANS
        if claimed is not None:
            self._claimed = in_claim_order(claimed_rows(claimed))
        return outcomes

    def _batch_claim(
        self, ask: Callable[[], BatchClaim | None], outcomes: Sequence[Outcome[Any]]
    ) -> BatchClaim | None:
        """What to claim in this batch's transaction: where it wrote messages and the
        delivery, ``ask``ed, says so (``Store.execute``'s ``claim_in_batch``).  The
        claim's own round trip and transaction after the commit are saved, and the
        writer starts the next batch sooner (docs/performance-notes.md, "The claim in
        the batch")."""
        if not any(o.messages for o in outcomes):
            return None
        try:
            return ask()
        except Exception:  # the delivery claims after the commit instead
            log.exception("claim in batch: asking the delivery failed")
            return None

    def take_claimed(self) -> list[OutboxRow] | None:
        claimed, self._claimed = self._claimed, None
        return claimed

    def reset(self) -> None:
        """Delete every row of every node, and restart outbox ids at 1 (debug only).

        The lock waits for every other transaction on the tables: no lock_timeout.
        """

        def delete_all(cur: Cur) -> None:
            cur.execute("SET LOCAL lock_timeout = 0")
            cur.execute(Q["reset"], prepare=False)

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

    def refused(self, exc: BaseException) -> StoreFault | None:
        """PostgreSQL's own (``postgres/faults.py``); a batch that lost every attempt
        to concurrent writers (``StoreBusy``) says nothing of the database's health."""
        if isinstance(exc, StoreBusy):
            return None
        if isinstance(exc, psycopg.OperationalError):
            return StoreFault("unavailable", str(exc))
        return write_refused(exc) or super().refused(exc)

    def probe(self) -> None:
        """One write transaction that rewrites the newest ``schema_version`` row as it
        is (refused by a read-only database, and by one out of reach)."""
        self.run(lambda cur: cur.execute(_PROBE))

    def _own(self, kind: type[Session]) -> Session:
        """The session of its own that ``kind`` names, opened on first use: operators'
        reads and retention never wait for the writer's lock, nor hold it."""
        with self._sessions_opening:
            session = self._sessions.get(kind)
            if session is None:
                session = kind(**self.session_options())
                self._sessions[kind] = session
            return session

    def session_options(self) -> dict[str, Any]:
        """What another session of this store connects with."""
        return {
            "url": self.url,
            "max_attempts": self.max_attempts,
            "lock_timeout": self.lock_timeout,
            "pooled": self.pooled,
        }

    def read_many(self, jobs: Sequence[Job[Any]]) -> list[Outcome[Any]]:
        """In one REPEATABLE READ snapshot on the calling thread's own session, locking
        nothing: reads neither wait for the writer's lock nor for a row another node's
        request holds, and they see every commit acknowledged before they began.  The
        rows the requests name are read first in one round trip (``preread``)."""
        ident = threading.get_ident()
        session = self._readers.get(ident)
        if session is None:
            try:
                session = ReadSession(**self.session_options())
            except psycopg.OperationalError as exc:
                raise StoreUnavailable(f"postgres unreachable: {exc}") from exc
            with self._sessions_opening:
                self._readers[ident] = session

        def batch(cur: Cur) -> list[Outcome[Any]]:
            backend = PostgresBackend(cur, locking=False)
            backend.preread({k for job in jobs for k in job.keys})
            return [read_only(backend, job.fn, (psycopg.Error,)) for job in jobs]

        try:
            return session.run(batch, snapshot=True)
        except psycopg.Error as exc:
            raise StoreUnavailable(f"postgres reader failed: {exc}") from exc

    def next_deadline(self, within: tuple[int, int] | None = None) -> int | None:
        """On a session of its own, one autocommit statement that locks nothing: the
        writer never waits for it (:attr:`Store.deadline_apart`).  It sees only what
        has committed; the timer wakes again for a deadline that a batch commits
        while it reads (``engine/timer.py``).  ``within`` bounds each index walk."""
        session = self._own(DeadlineSession)
        try:
            return session.run_single(lambda cur: PostgresBackend(cur).next_deadline(within))
        except psycopg.Error as exc:
            raise StoreUnavailable(f"postgres deadline read failed: {exc}") from exc

    def inspect(self, fn: Callable[[Inspection], T]) -> T:
        """In one REPEATABLE READ snapshot, locking nothing."""
        reader = self._own(InspectionSession)
        return reader.run(lambda cur: fn(SqlInspection(cur, CODEC, "%s")), snapshot=True)

    def retain(self, fn: Callable[[Retention], T]) -> T:
        """Skip-locked: it never waits for a request's row."""
        lock = "FOR UPDATE SKIP LOCKED"
        session = self._own(RetentionSession)
        return session.run(lambda cur: fn(SqlRetention(cur, CODEC, "%s", lock)))

    def close(self) -> None:
        self.outbox.close()
        with self._sessions_opening:
            for session in [*self._sessions.values(), *self._readers.values()]:
                session.close()
            self._sessions.clear()
            self._readers.clear()
        Session.close(self)

    def schema_version(self) -> int:
        """The stored schema version (for diagnostics and tests)."""

        return self.run(lambda cur: check_version(PgSchema(cur.connection)))


class ReadSession(Session):
    """Requests that only read (``Store.read_many``): one per reader thread."""

    application_name = "troth-read"


class DeadlineSession(Session):
    """The timer's read of the next deadline (``Store.next_deadline``)."""

    application_name = "troth-deadline"


class InspectionSession(Session):
    """The operator's reads (``Store.inspect``): a connection of their own, so that a
    long read never waits for the writer's lock nor holds it."""

    application_name = "troth-inspect"


class RetentionSession(Session):
    """Retention's deletions (``Store.retain``), on a connection of their own."""

    application_name = "troth-retention"


class _Retry(Exception):
    """Internal: roll back and run the batch again (the cause is ``__cause__``)."""


class _Rerun(Exception):
    """Internal: a job was set aside; run the batch again without it."""


class _Unclaimed(Exception):
    """Internal: the writes and the claim failed together; run the batch again
    without the claim (the writes' failure, if it was theirs, then shows alone)."""


class _Careful(Exception):
    """Internal: run the batch again writing job by job, to find the failing job."""
