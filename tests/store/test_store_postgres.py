"""What only the PostgreSQL backend has to prove: several nodes on one database.

The shared contract (answers, snapshots, the outbox lifecycle) runs on postgres in
test_store_contract.py and test_dispatcher.py.  Here: migrations (also two nodes at
once), durability across reopen, the same answers as the memory store, and the
concurrency design of store/postgres.py: conflicting batches are re-run, never
answered with an error; deadlocks and creation races resolve; due lists and outbox
claims skip what another node holds.  "Nodes" are stores, each with its own
connection, driven from threads.

PostgreSQL must be reachable (tests/helpers/pg.py): these tests fail, not skip, without it.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import string
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest

from helpers import pg
from helpers.store_jobs import EXT, Model, outcomes_of, promise, put, run, schedule
from troth.machine.core import handle, lock_keys, settled_keys, tick
from troth.machine.internal import Config
from troth.machine.state import Response
from troth.outbox.rows import RowState, Settlement
from troth.protocol import requests as rq
from troth.protocol.address import PollAddress, parse_poll
from troth.protocol.records import Execute, PromiseRecord, Task, TaskRecord, Unblock, Value
from troth.server.config import ConfigError, Settings
from troth.server.run import open_store
from troth.store.base import BatchClaim, Job, Overlay, Store
from troth.store.memory import MemoryStore
from troth.store.outbox import settle_one
from troth.store.postgres import PostgresStore, StoreBusy, Unstorable
from troth.store.postgres.outbox import Routing
from troth.store.postgres.session import TextArray
from troth.store.sql.migrate import Migration, SchemaTooNew, load_migrations


def migrations() -> tuple[Migration, ...]:
    return load_migrations("troth.store.postgres")


def latest_version() -> int:
    return len(migrations())


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    s = pg.fresh_store(pg_url)
    yield s
    s.close()


@pytest.fixture
def nodes(pg_url: str) -> Iterator[Callable[[int], list[PostgresStore]]]:
    """``nodes(n)``: n stores (n connections) on the module's emptied database."""
    opened: list[PostgresStore] = []

    def make(n: int) -> list[PostgresStore]:
        for _ in range(n):
            opened.append(PostgresStore(pg_url))
        opened[0].reset()
        return opened[-n:]

    yield make
    for s in opened:
        s.close()


def raw(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    """A plain connection standing for "another node" holding locks."""
    return psycopg.connect(url)


# -- migrations ---------------------------------------------------------------------------


def tables(url: str) -> set[str]:
    with raw(url) as conn:
        found = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        ).fetchall()
    return {r[0] for r in found}


def test_migrations_are_numbered_without_gaps() -> None:
    assert [m.version for m in migrations()] == list(range(1, latest_version() + 1))


def test_a_fresh_database_is_migrated_once() -> None:
    with pg.throwaway_database() as url:
        s = PostgresStore(url)
        assert s.schema_version() == latest_version()
        s.close()
        assert tables(url) == {
            "schema_version",
            "promises",
            "tasks",
            "schedules",
            "outbox",
            "nodes",
            "connections",
            "worker_groups",
            "flow_limits",
            "flow_slots",
            "flow_held",
        }
        PostgresStore(url).close()  # reopening applies nothing again
        with raw(url) as conn:
            rows = conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
        assert [r[0] for r in rows] == list(range(1, latest_version() + 1))


def test_two_nodes_migrating_a_fresh_database_at_once() -> None:
    with pg.throwaway_database() as url:
        start = threading.Barrier(4)
        opened: list[PostgresStore] = []
        errors: list[BaseException] = []

        def node() -> None:
            start.wait()
            try:
                opened.append(PostgresStore(url))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=node) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert [s.schema_version() for s in opened] == [latest_version()] * 4
        put(opened[0], promise("p"))
        assert run(opened[1], lambda tx: tx.get_promise("p")) == promise("p")
        for s in opened:
            s.close()
        with raw(url) as conn:
            count = conn.execute("SELECT count(*) FROM schema_version").fetchone()
        assert count == (latest_version(),)


def test_version_1_outbox_rows_get_their_destination_on_upgrade() -> None:
    """Version 2 adds the parsed poll:// destination that claims route on; rows left
    pending by a version-1 server must be routed like new ones."""
    v1 = migrations()[0]
    with pg.throwaway_database() as url:
        with raw(url) as conn:
            conn.execute(
                "CREATE TABLE schema_version (version INTEGER PRIMARY KEY,"
                " name TEXT NOT NULL, applied_at BIGINT NOT NULL)"
            )
            conn.execute(v1.sql)
            conn.execute("INSERT INTO schema_version VALUES (1, %s, 0)", (v1.name,))
            for key, address in [
                ("u", "poll://uni@Workers/w1"),
                ("a", "poll://any@workers"),
                ("p", "poll://any@workers/w2"),
                ("h", "http://example.com/hook"),
                ("bad", "poll://uni@workers"),
            ]:
                conn.execute(
                    "INSERT INTO outbox (key, address, kind, task_id, version, created_at,"
                    " available_at, updated_at) VALUES (%s, %s, 'execute', %s, 0, 1, 1, 1)",
                    (key, address, key),
                )
        PostgresStore(url).close()
        with raw(url) as conn:
            found = {
                r[0]: (r[1], r[2], r[3])
                for r in conn.execute(
                    "SELECT key, dest_cast, dest_group, dest_id FROM outbox"
                ).fetchall()
            }
        assert found == {
            "u": ("uni", "workers", "w1"),
            "a": ("any", "workers", None),
            "p": ("any", "workers", "w2"),
            "h": (None, None, None),
            "bad": (None, None, None),
        }
        # the same answer as the parser new rows are routed by
        assert parse_poll("poll://uni@Workers/w1") == PollAddress("uni", "workers", "w1")
        assert parse_poll("poll://uni@workers") is None


def test_a_newer_schema_is_refused_and_left_untouched() -> None:
    with pg.throwaway_database() as url:
        with raw(url) as conn:
            conn.execute(
                "CREATE TABLE schema_version (version INTEGER PRIMARY KEY,"
                " name TEXT NOT NULL, applied_at BIGINT NOT NULL)"
            )
            conn.execute("INSERT INTO schema_version VALUES (%s, 'future', 0)", (99,))
        with pytest.raises(SchemaTooNew) as info:
            PostgresStore(url)
        assert info.value.found == 99 and info.value.known == latest_version()
        assert tables(url) == {"schema_version"}


# -- durability and equivalence ---------------------------------------------------------------


def test_everything_survives_reopening(pg_url: str, store: PostgresStore) -> None:
    rec = promise("p", "resolved", settled_at=2).record()

    def job(tx: Overlay) -> None:
        tx.set_promise(promise("p", "resolved", settled_at=2, listeners=("poll://any@l",)))
        tx.set_promise(promise("big", tags=EXT, timeout_at=2**80, created_at=2**63))
        tx.set_task(Task("p", "fulfilled", 2**65, ttl=5, pid="w", resumes=("q",)))
        tx.set_schedule(schedule("s", 10**20, tags={"resonate:target": "poll://any@g"}))
        tx.set_message("poll://any@l", Unblock(rec))
        tx.set_message("poll://any@g", Execute("p", 3))

    run(store, job, now=5)
    [claimed] = store.outbox.claim_due("w", 5, 1, "tok")
    before = store.snapshot()
    store.close()
    again = PostgresStore(pg_url)
    try:
        assert again.snapshot() == before
        assert settle_one(again.outbox, claimed.id, "tok", "completed", 6)
        assert run(again, lambda tx: tx.next_deadline()) == 0  # "p" is undrained
    finally:
        again.close()


@pytest.mark.parametrize("seed", range(6))
def test_same_answers_as_memory(seed: int, store: PostgresStore) -> None:
    """test_store_contract's differential model, memory against postgres."""
    model = Model(seed)
    memory = MemoryStore()
    for step in range(120):
        batch = [Job(model.job(), model.rng.randint(0, 30)) for _ in range(model.rng.randint(1, 3))]
        assert outcomes_of(memory, batch) == outcomes_of(store, batch), step
        for _ in range(2):
            q = model.query()
            assert memory.read(q) == store.read(q), step
        for _ in range(model.rng.randint(0, 3)):
            op = model.lifecycle()
            assert op(memory) == op(store), step
        if step % 40 == 39:
            assert memory.snapshot() == store.snapshot(), step
        if step == 80:
            memory.reset()
            store.reset()
    assert memory.snapshot() == store.snapshot()


# -- what PostgreSQL cannot store ----------------------------------------------------------------


def test_nul_is_refused_alone_and_never_found(store: PostgresStore) -> None:
    def bad(tx: Overlay) -> None:
        tx.set_promise(promise("a\x00b"))

    def bad_tag(tx: Overlay) -> None:
        tx.set_promise(promise("t", tags={"k": "v\x00"}))

    def good(tx: Overlay) -> None:
        tx.set_promise(promise("ok", tags={"k": "v"}))

    outcomes = store.execute([Job(bad, 0), Job(bad_tag, 0), Job(good, 0)])
    assert isinstance(outcomes[0].error, Unstorable) and isinstance(outcomes[1].error, Unstorable)
    assert outcomes[2].error is None and outcomes[2].wrote
    assert [p["id"] for p in store.snapshot()["promises"]] == ["ok"]
    assert run(store, lambda tx: tx.get_promise("a\x00b")) is None
    assert run(store, lambda tx: tx.get_task("a\x00b")) is None
    assert run(store, lambda tx: tx.get_schedule("a\x00b")) is None
    assert run(store, lambda tx: tx.scan_promises(None, {"k": "v\x00"}, None, 10)) == []
    assert run(store, lambda tx: tx.scan_promises({"pending\x00"}, {}, None, 10)) == []
    assert run(store, lambda tx: tx.promises_in_branch("b\x00", 10)) == []
    # A cursor with a NUL pages exactly as the code-point comparison would.
    put(store, promise("ok0"), promise("ol"))
    ids = run(store, lambda tx: [p.id for p in tx.scan_promises(None, {}, "ok\x00z", 10)])
    assert ids == ["ok0", "ol"]


# -- re-running batches ---------------------------------------------------------------------------


def test_a_job_whose_read_fails_is_set_aside_and_the_batch_commits(store: PostgresStore) -> None:
    def write(id: str) -> Callable[[Overlay], str]:
        def job(tx: Overlay) -> str:
            tx.set_promise(promise(id))
            return id

        return job

    def failing_read(tx: Overlay) -> Any:
        tx.set_promise(promise("never"))
        return tx.scan_promises(None, {}, None, -1)  # LIMIT -1: the server refuses it

    outcomes = store.execute([Job(write("a"), 0), Job(failing_read, 0), Job(write("c"), 0)])
    assert [o.value for o in outcomes] == ["a", None, "c"]
    assert isinstance(outcomes[1].error, psycopg.Error) and not outcomes[1].wrote
    assert [p["id"] for p in store.snapshot()["promises"]] == ["a", "c"]
    assert store.reruns == 1 and store.retries == 0


def test_a_deferred_write_that_fails_is_pinned_on_its_job_by_a_careful_rerun(
    store: PostgresStore,
) -> None:
    """Writes go out together at the end of a batch; when one of them fails for good
    (an id too long for the primary key's index), the batch runs again writing job
    by job, so only the job that wrote it fails and its neighbours commit."""
    huge = "".join(random.Random(7).choices(string.ascii_letters, k=20_000))

    def write(id: str) -> Callable[[Overlay], str]:
        def job(tx: Overlay) -> str:
            tx.set_promise(promise(id))
            return id[:8]

        return job

    outcomes = store.execute([Job(write("a"), 0), Job(write(huge), 0), Job(write("c"), 0)])
    assert [o.value for o in outcomes] == ["a", None, "c"]
    assert isinstance(outcomes[1].error, psycopg.Error)
    assert [p["id"] for p in store.snapshot()["promises"]] == ["a", "c"]
    assert store.retries == 0 and store.reruns == 2  # careful, then without the job


class Gate:
    """Holds the first attempt of a job at one point until the test opens it."""

    def __init__(self) -> None:
        self.attempts = 0
        self.reached = threading.Event()
        self.open = threading.Event()

    def first_attempt_waits(self) -> None:
        self.attempts += 1
        if self.attempts == 1:
            self.reached.set()
            assert self.open.wait(10)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    return t, out


def test_a_creation_race_is_rerun_and_answers_from_the_winner(
    nodes: Callable[[int], list[PostgresStore]],
) -> None:
    a, b = nodes(2)
    gate = Gate()

    def create(tx: Overlay) -> str:
        found = tx.get_promise("x")
        gate.first_attempt_waits()
        if found is not None:
            return f"found {found.param.data}"
        tx.set_promise(promise("x", param=Value(data="from-a")))
        return "created"

    t, out = in_thread(lambda: a.execute([Job(create, 0)]))
    assert gate.reached.wait(10)
    put(b, promise("x", param=Value(data="from-b")))  # "x" was absent: nothing blocks it
    gate.open.set()
    t.join(10)
    [[outcome]] = out
    assert outcome.error is None and outcome.value == "found from-b"
    assert gate.attempts == 2 and a.retries == 1


def test_a_row_appearing_after_an_absent_read_is_not_seen_by_that_batch(
    nodes: Callable[[int], list[PostgresStore]],
) -> None:
    """Reads are repeatable within a batch (the backend keeps what it read): a row
    another node creates meanwhile does not change this batch's view, which is the
    state of one instant.  Had the batch created the row itself, its INSERT would
    meet the other's and the batch would re-run (the creation-race test above)."""
    a, b = nodes(2)
    gate = Gate()

    def twice(tx: Overlay) -> tuple[bool, bool]:
        first = tx.get_task("x") is None
        gate.first_attempt_waits()
        return first, tx.get_task("x") is None

    t, out = in_thread(lambda: a.execute([Job(twice, 0)]))
    assert gate.reached.wait(10)
    put(b, Task("x", "pending", 0))
    gate.open.set()
    t.join(10)
    assert out[0][0].value == (True, True)  # one consistent view
    assert gate.attempts == 1 and a.retries == 0


def test_a_deadlock_is_rerun_and_both_batches_commit(
    nodes: Callable[[int], list[PostgresStore]],
) -> None:
    a, b = nodes(2)
    put(a, promise("p1"), promise("p2"))
    a_holds, b_holds = Gate(), Gate()

    def lock_both(first: str, second: str, mine: Gate, theirs: Gate) -> Callable[[Overlay], str]:
        def job(tx: Overlay) -> str:
            p = tx.get_promise(first)
            assert p is not None
            mine.attempts += 1
            if mine.attempts == 1:
                mine.reached.set()
                assert theirs.reached.wait(10)  # each holds one row, then wants the other
            q = tx.get_promise(second)
            assert q is not None
            tx.set_promise(promise(first, tags={"by": first}))
            return first

        return job

    ta, out_a = in_thread(lambda: a.execute([Job(lock_both("p1", "p2", a_holds, b_holds), 0)]))
    tb, out_b = in_thread(lambda: b.execute([Job(lock_both("p2", "p1", b_holds, a_holds), 0)]))
    ta.join(20)
    tb.join(20)
    assert out_a[0][0].value == "p1" and out_b[0][0].value == "p2"
    assert a.retries + b.retries in (1, 2)  # a victim (or both) re-ran
    tags = {p["id"]: p["tags"] for p in a.snapshot()["promises"]}
    assert tags == {"p1": {"by": "p1"}, "p2": {"by": "p2"}}


def test_declared_keys_are_locked_in_sorted_order_so_opposite_orders_do_not_deadlock(
    nodes: Callable[[int], list[PostgresStore]],
) -> None:
    """The same two batches as above, but declaring the ids they read (Job.keys, as
    the engine does from the request): both lock p1 then p2 up front, so the second
    waits for the first instead of deadlocking, and neither re-runs."""
    a, b = nodes(2)
    put(a, promise("p1"), promise("p2"))
    order: list[str] = []
    a_in = threading.Event()

    def job(first: str, second: str) -> Callable[[Overlay], str]:
        def run(tx: Overlay) -> str:
            assert tx.get_promise(first) is not None
            if first == "p1":
                a_in.set()
                time.sleep(0.3)  # b is started meanwhile and must wait at its prelock
            assert tx.get_promise(second) is not None
            tx.set_promise(promise(first, tags={"by": first}))
            order.append(first)
            return first

        return run

    keys = ("p2", "p1")  # any order: the store sorts them
    ta, out_a = in_thread(lambda: a.execute([Job(job("p1", "p2"), 0, keys)]))
    assert a_in.wait(10)
    tb, out_b = in_thread(lambda: b.execute([Job(job("p2", "p1"), 0, keys)]))
    ta.join(20)
    tb.join(20)
    assert out_a[0][0].value == "p1" and out_b[0][0].value == "p2"
    assert order == ["p1", "p2"]
    assert a.retries == 0 and b.retries == 0


def test_reading_a_task_locks_its_promise_first(pg_url: str, store: PostgresStore) -> None:
    put(store, promise("x"), Task("x", "pending", 0))
    with raw(pg_url) as other:
        other.execute("SELECT 1 FROM promises WHERE id = 'x' FOR UPDATE")
        t, out = in_thread(lambda: run(store, lambda tx: tx.get_task("x")))
        time.sleep(0.3)
        assert not out  # waiting for the promise's lock, not holding the task's
        other.execute("SELECT 1 FROM tasks WHERE id = 'x' FOR UPDATE NOWAIT")
        other.commit()
    t.join(10)
    assert out == [Task("x", "pending", 0)]


def test_a_batch_that_keeps_losing_fails_with_store_busy(pg_url: str) -> None:
    s = PostgresStore(pg_url, max_attempts=3)
    try:

        def always_conflicts(tx: Overlay) -> None:
            raise psycopg.errors.SerializationFailure("stand-in")

        # A job's own 40001 without an aborted transaction is still a conflict: the
        # whole batch re-runs, and gives up after max_attempts.
        [outcome] = s.execute([Job(always_conflicts, 0)])
        assert isinstance(outcome.error, StoreBusy) and s.retries == 3
    finally:
        s.close()


def test_a_lost_connection_is_reopened_and_the_batch_run_again(
    pg_url: str, store: PostgresStore
) -> None:
    put(store, promise("p"))
    pid = store.conn.info.backend_pid
    with raw(pg_url) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    assert run(store, lambda tx: tx.get_promise("p")) == promise("p")
    assert store.conn.info.backend_pid != pid and store.retries == 1
    pid = store.conn.info.backend_pid
    with raw(pg_url) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    store.ping()  # /ready reconnects too
    assert store.outbox.next_due() is None


# -- SKIP LOCKED: nodes share timer and dispatch work ----------------------------------------------


def test_due_lists_skip_what_another_node_is_firing(pg_url: str, store: PostgresStore) -> None:
    put(
        store,
        promise("a", tags=EXT, timeout_at=1),
        promise("b", tags=EXT, timeout_at=2),
        Task("a", "pending", 0, retry_at=1),
        Task("b", "acquired", 1, expires_at=2),
        schedule("a", 1),
        schedule("b", 2),
        promise("u", "resolved", settled_at=1, callbacks=("x",)),
    )
    with raw(pg_url) as other:
        for table in ("promises", "tasks", "schedules"):
            other.execute(f"SELECT 1 FROM {table} WHERE id IN ('a', 'u') FOR UPDATE")

        def due(tx: Overlay) -> tuple[list[str], ...]:
            return (
                tx.due_promises(10, 10),
                tx.due_tasks(10, 10),
                tx.due_schedules(10, 10),
                tx.undrained_promises(10),
            )

        assert run(store, due) == (["b"], ["b"], ["b"], [])  # and nothing waited
    assert run(store, due) == (["a", "b"], ["a", "b"], ["a", "b"], ["u"])


def test_claims_skip_rows_another_node_holds(pg_url: str, store: PostgresStore) -> None:
    run(store, lambda tx: [tx.set_message("poll://any@g", Execute(f"t{i}", 0)) for i in range(6)])
    with raw(pg_url) as other:
        other.execute("SELECT 1 FROM outbox WHERE id <= 2 FOR UPDATE")
        assert [r.id for r in store.outbox.claim_due("w", 0, 10, "t1")] == [3, 4, 5, 6]
    assert [r.id for r in store.outbox.claim_due("w", 0, 10, "t2")] == [1, 2]


def _outbox_states(pg_url: str) -> dict[int, tuple[str, str | None]]:
    with raw(pg_url) as c:
        rows = c.execute("SELECT id, state, claim_token FROM outbox ORDER BY id").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def test_a_batch_that_writes_messages_claims_them_before_its_commit(
    pg_url: str, store: PostgresStore
) -> None:
    asked: list[int] = []

    def ask() -> BatchClaim:
        asked.append(1)
        return BatchClaim("w", 0, 2, f"tok{len(asked)}")

    run(store, lambda tx: tx.get_promise("p"), claim_in_batch=ask)  # no message: not asked
    assert asked == [] and store.take_claimed() is None
    run(
        store,
        lambda tx: [tx.set_message("poll://any@g", Execute(f"t{i}", 0)) for i in range(3)],
        claim_in_batch=ask,
    )
    claimed = store.take_claimed()
    assert claimed is not None and [r.id for r in claimed] == [1, 2]  # the limit, in order
    assert all(r.state == RowState.DISPATCHING and r.claim_token == "tok1" for r in claimed)
    assert store.take_claimed() is None  # taken once
    # Committed with the batch, exactly as a claim after the commit would leave them.
    assert _outbox_states(pg_url) == {
        1: ("dispatching", "tok1"),
        2: ("dispatching", "tok1"),
        3: ("pending", None),
    }
    assert [r.id for r in store.outbox.claim_due("w", 0, 10, "later")] == [3]


def test_an_execute_claimed_in_its_batch_replaces_its_tasks_pending_one(
    pg_url: str, store: PostgresStore
) -> None:
    """One pending ``execute`` per task: a newer one, inserted claimed, takes the place
    of the one still pending (the task existed before the batch)."""
    run(store, lambda tx: tx.set_message("poll://any@g", Execute("t", 0)))
    assert _outbox_states(pg_url) == {1: ("pending", None)}
    claim = BatchClaim("w", 0, 8, "tok")
    run(
        store,
        lambda tx: tx.set_message("poll://any@g", Execute("t", 1)),
        claim_in_batch=lambda: claim,
    )
    assert _outbox_states(pg_url) == {2: ("dispatching", "tok")}


def test_the_execute_of_a_task_its_batch_created_is_inserted_claimed_without_a_delete(
    pg_url: str, store: PostgresStore, tmp_path: Path
) -> None:
    """No pending row can share the key of a task's first ``execute``: the batch does
    not look for one (that look walks the dead entries a held horizon leaves)."""

    def create(tx: Overlay) -> None:
        assert tx.get_task("fresh") is None
        tx.set_task(Task("fresh", "pending", 0))
        tx.set_message("poll://any@g", Execute("fresh", 0))

    claim = BatchClaim("w", 0, 8, "tok")
    _, sent = _traced(store, [Job(create, 0)], tmp_path, claim_in_batch=lambda: claim)
    assert any("INSERT INTO outbox" in line for line in sent), sent
    assert not any("DELETE FROM outbox" in line for line in sent), sent
    assert _outbox_states(pg_url) == {1: ("dispatching", "tok")}


def test_a_failing_claim_in_a_batch_costs_the_batch_nothing(
    pg_url: str, store: PostgresStore
) -> None:
    # A negative LIMIT fails the claim's statement inside the batch's transaction:
    # the batch runs again without the claim, and its writes commit.
    bad = BatchClaim("w", 0, -1, "bad")
    run(
        store,
        lambda tx: tx.set_message("poll://any@g", Execute("t", 0)),
        claim_in_batch=lambda: bad,
    )
    assert store.take_claimed() is None and store.reruns == 1
    assert list(_outbox_states(pg_url).values()) == [("pending", None)]

    def broken() -> BatchClaim | None:  # nor does a delivery that cannot say what to claim
        raise ZeroDivisionError

    run(store, lambda tx: tx.set_message("poll://any@g", Execute("u", 0)), claim_in_batch=broken)
    assert store.take_claimed() is None and len(_outbox_states(pg_url)) == 2


def test_a_batch_whose_claim_is_declined_claims_nothing(pg_url: str, store: PostgresStore) -> None:
    def declined() -> BatchClaim | None:  # delivery paused or stopping
        return None

    run(store, lambda tx: tx.set_message("poll://any@g", Execute("t", 0)), claim_in_batch=declined)
    assert store.take_claimed() is None
    assert _outbox_states(pg_url) == {1: ("pending", None)}


def _traced(
    store: PostgresStore,
    jobs: list[Job[Any]],
    tmp: Path,
    *,
    claim_in_batch: Callable[[], BatchClaim | None] | None = None,
) -> tuple[list[Any], list[str]]:
    """One batch's answers (none failed), and the messages the writer's connection
    sent for it."""
    trace = tmp / "pq.trace"
    with trace.open("w") as f:
        store.conn.pgconn.trace(f.fileno())
        try:
            outcomes = store.execute(jobs, claim_in_batch)
        finally:
            store.conn.pgconn.untrace()
    assert all(o.error is None for o in outcomes)
    sent = [line for line in trace.read_text().splitlines() if "\tF\t" in line]
    return [o.value for o in outcomes], sent


def _syncs(sent: list[str]) -> int:
    """Round trips among traced messages: one Sync each."""
    return sum(1 for line in sent if "\tSync" in line)


def _syncs_of(store: PostgresStore, jobs: list[Job[Any]], tmp: Path) -> tuple[int, int]:
    """Syncs (round trips) and BEGINs the writer's connection sent for one batch."""
    _, sent = _traced(store, jobs, tmp)
    return _syncs(sent), sum(1 for line in sent if '"BEGIN' in line)


def _same_on_memory(store: PostgresStore, setup: list[rq.Req]) -> MemoryStore:
    """``setup`` run request by request on ``store`` and on a new memory store (each
    answered 200 or 201): the memory store is what ``store`` must answer like."""
    memory = MemoryStore()
    for target in (store, memory):
        for req in setup:
            outcome = target.execute([_request_job(req)])[0]
            assert outcome.error is None and outcome.value.status in (200, 201), req
    return memory


def _round_trips_and_answers(
    store: PostgresStore, memory: MemoryStore, jobs: list[Job[Any]], tmp: Path
) -> int:
    """Syncs ``store`` sent for the batch ``jobs``, whose answers are checked against
    the memory store's for the same batch."""
    answers, sent = _traced(store, jobs, tmp)
    assert answers == [o.value for o in memory.execute(jobs)]
    return _syncs(sent)


def test_the_dispatchers_claim_settlement_and_notify_are_one_round_trip_each(
    pg_url: str, store: PostgresStore, tmp_path: Path
) -> None:
    """One statement each, sent in autocommit mode: no BEGIN, no COMMIT, one Sync —
    and what they did is committed (another connection sees it at once)."""
    run(store, lambda tx: [tx.set_message("poll://any@g", Execute(f"t{i}", 0)) for i in range(3)])
    conn = store.outbox.session.conn
    trace = tmp_path / "outbox.trace"

    def sent(call: Callable[[], Any]) -> tuple[Any, list[str]]:
        with trace.open("w") as f:
            conn.pgconn.trace(f.fileno())
            try:
                value = call()
            finally:
                conn.pgconn.untrace()
        kinds = [line.split("\t")[3] for line in trace.read_text().splitlines() if "\tF\t" in line]
        return value, kinds

    one_round_trip = ["Parse", "Bind", "Describe", "Execute", "Sync"]
    rows, kinds = sent(lambda: store.outbox.claim_due("w", 0, 2, "tok"))
    assert [r.id for r in rows] == [1, 2] and kinds == one_round_trip
    assert _outbox_states(pg_url)[1] == ("dispatching", "tok")
    done = [Settlement(r.id, "tok", RowState.COMPLETED, 1) for r in rows]
    settled, kinds = sent(lambda: store.outbox.settle(done))
    assert settled == [True, True] and kinds == one_round_trip
    assert [state for state, _ in _outbox_states(pg_url).values()] == [
        "completed",
        "completed",
        "pending",
    ]
    with raw(pg_url) as listener:
        listener.autocommit = True
        listener.execute("LISTEN troth")
        _, kinds = sent(lambda: store.outbox.notify("n1 1 -"))
        assert kinds == one_round_trip
        assert [n.payload for n in listener.notifies(timeout=2, stop_after=1)] == ["n1 1 -"]
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert not conn.autocommit  # the session's other transactions are as they were


def test_a_batch_whose_statement_is_canceled_before_its_commit_runs_again(
    pg_url: str, store: PostgresStore
) -> None:
    """57014 before COMMIT (an operator's cancel, or PostgreSQL's report of a lock
    timeout that fired as the wait ended) changed nothing: the batch runs again, and
    the job never sees the error."""
    put(store, promise("p"))
    pid = store.conn.info.backend_pid

    def waiting_on_a_lock(admin: psycopg.Connection[tuple[Any, ...]]) -> bool:
        row = admin.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        return row is not None and row[0] == "Lock"

    outcome: list[Any] = []
    with raw(pg_url) as holder, raw(pg_url) as admin:
        admin.autocommit = True
        holder.execute("SELECT 1 FROM promises WHERE id = 'p' FOR UPDATE")
        job = Job(lambda tx: tx.get_promise("p"), 0, ("p",))  # prefetched: waits, no timeout
        worker = threading.Thread(target=lambda: outcome.extend(store.execute([job])))
        worker.start()
        try:
            retries = store.retries
            for waits in range(2):  # canceled once, then waiting again in the re-run
                deadline = time.monotonic() + 10
                while not waiting_on_a_lock(admin):
                    assert time.monotonic() < deadline, "the batch never waited for the lock"
                    time.sleep(0.01)
                if waits == 0:
                    assert admin.execute("SELECT pg_cancel_backend(%s)", (pid,)).fetchone()
                    deadline = time.monotonic() + 10
                    while store.retries == retries:
                        assert time.monotonic() < deadline, "the canceled batch did not re-run"
                        time.sleep(0.01)
        finally:
            holder.commit()
            worker.join(10)
    [done] = outcome
    assert done.error is None and done.value is not None and done.value.id == "p"


def test_a_one_statement_settlement_waits_out_a_lock_by_running_again(
    pg_url: str, store: PostgresStore
) -> None:
    """A row another transaction holds: the settlement's statement meets the
    session's lock_timeout, fails whole, and is sent again until it gets through."""
    run(store, lambda tx: tx.set_message("poll://any@g", Execute("t", 0)))
    [row] = store.outbox.claim_due("w", 0, 1, "tok")
    session = store.outbox.session
    retries = session.retries
    with raw(pg_url) as holder:
        holder.execute("SELECT id FROM outbox WHERE id = %s FOR UPDATE", (row.id,))
        timer = threading.Timer(0.2, holder.commit)
        timer.start()
        try:
            settled = store.outbox.settle([Settlement(row.id, "tok", RowState.COMPLETED, 1)])
        finally:
            timer.join()
    assert settled == [True]
    assert session.retries > retries
    assert _outbox_states(pg_url)[row.id] == ("completed", None)


def test_a_batch_is_two_round_trips_its_begin_sent_with_the_last_commit(
    pg_url: str, store: PostgresStore, tmp_path: Path
) -> None:
    """The prefetch, then the writes with COMMIT and the next transaction's BEGIN: two
    syncs.  Without the BEGIN ready, it goes with the prefetch (wire.py) — where
    psycopg's cursor sent it alone, a round trip of its own."""

    def job(id: str) -> Job[None]:
        return Job(
            lambda tx: tx.set_promise(promise(id)) if tx.get_promise(id) is None else None, 0, (id,)
        )

    assert _syncs_of(store, [job("a"), job("b")], tmp_path) == (2, 2)  # first: BEGIN sent along
    assert store.begun
    assert _syncs_of(store, [job("c"), job("d")], tmp_path) == (2, 1)  # the next BEGIN only
    with raw(pg_url) as c:
        states = c.execute(
            "SELECT state, backend_xmin FROM pg_stat_activity WHERE pid = %s",
            (store.conn.info.backend_pid,),
        ).fetchall()
        locks = c.execute(
            "SELECT count(*) FROM pg_locks WHERE pid = %s AND locktype <> 'virtualxid'",
            (store.conn.info.backend_pid,),
        ).fetchone()
    # Nothing run in it: no snapshot held back from vacuum, no lock.
    assert states == [("idle in transaction", None)] and locks == (0,)
    assert run(store, lambda tx: tx.get_promise("c")) == promise("c")


def _request_job(req: rq.Req, now: int = 1) -> Job[Response]:
    """A request as the engine makes it a job: the machine's handler, its lock keys,
    the ids it may settle."""
    keys = lock_keys(req)
    return Job(lambda tx: handle(tx, req, now, CONFIG, {}), now, keys, settled_keys(req, keys))


def test_a_batch_settling_awaited_children_reads_their_awaiters_in_one_round_trip(
    store: PostgresStore, tmp_path: Path
) -> None:
    """A fan-out's last step: a batch settles the children four suspended parents
    wait on.  Each settle resumes its parent, which the requests do not name: read
    one by one, each parent cost two round trips (its promise, its task) in the
    middle of the batch.  The batch now reads them all, locked, right after its own
    rows — one round trip whatever the number of parents — and answers as the
    memory store does."""
    parents = [f"p{i}" for i in range(4)]
    setup: list[rq.Req] = []
    for p in parents:
        setup += [
            rq.PromiseCreate(p, 10**12, Value(), TARGET),
            rq.TaskAcquire(p, 0, "w", 10**9),
            rq.PromiseCreate(f"{p}.c", 10**12, Value(), EXT),
        ]
    for p in parents:
        action = rq.Action(
            "promise.register_callback",
            msgspec.json.encode({"awaited": f"{p}.c", "awaiter": p}),
        )
        setup.append(rq.TaskSuspend(p, 1, [action]))  # acquired: version 1
    memory = _same_on_memory(store, setup)
    # A batch that names the children and settles none reads no awaiter: its rows
    # (its COMMIT, with nothing written, is a simple query: no sync); the parents
    # stay unlocked for whoever settles a child.
    reads = [_request_job(rq.PromiseGet(f"{p}.c")) for p in parents]
    assert _round_trips_and_answers(store, memory, reads, tmp_path) == 1
    settles = [_request_job(rq.PromiseSettle(f"{p}.c", "resolved")) for p in parents]
    # Its rows with the BEGIN before them (the read-only batch ended with a plain
    # COMMIT), their awaiters, the COMMIT.
    assert _round_trips_and_answers(store, memory, settles, tmp_path) == 3
    again = [_request_job(rq.TaskGet(p)) for p in parents]
    answers = [o.value for o in store.execute(again)]
    assert answers == [o.value for o in memory.execute(again)]
    assert [a.data["task"].state for a in answers] == ["pending"] * 4  # all resumed


def test_a_timer_pass_reads_the_tasks_and_awaiters_of_its_due_promises_at_once(
    store: PostgresStore, tmp_path: Path
) -> None:
    """Four targeted promises time out, each with its task, and one of them is awaited
    by a suspended parent.  The pass's four due lists, the tasks and the awaiter in
    one round trip, then the COMMIT: six, where each task (and the parent's promise
    and task) cost one of its own; and the same outcome as the memory store."""
    setup: list[rq.Req] = [
        rq.PromiseCreate("parent", 10**12, Value(), TARGET),
        rq.TaskAcquire("parent", 0, "w", 10**9),
    ]
    setup += [rq.PromiseCreate(f"t{i}", 100, Value(), TARGET) for i in range(4)]
    action = rq.Action(
        "promise.register_callback", msgspec.json.encode({"awaited": "t0", "awaiter": "parent"})
    )
    setup.append(rq.TaskSuspend("parent", 1, [action]))
    memory = _same_on_memory(store, setup)
    passes = [Job(lambda tx: tick(tx, 200, CONFIG), 200)]
    assert _round_trips_and_answers(store, memory, passes, tmp_path) == 6
    snapshot = store.snapshot()
    assert snapshot == memory.snapshot()
    resumed = [r["message"] for r in snapshot["outbox"] if r["key"] == "parent"]
    assert [(m["kind"], m["version"]) for m in resumed] == [("execute", 1)]


def test_a_timer_pass_reads_the_promises_of_its_due_tasks_at_once(
    store: PostgresStore, tmp_path: Path
) -> None:
    """Four leases expire: the pass reads each task's promise (still pending?).  The
    four due lists, the promises in one round trip, the COMMIT: six syncs, where each
    promise cost one of its own; and the same outcome as the memory store."""
    setup: list[rq.Req] = []
    for i in range(4):
        setup += [
            rq.PromiseCreate(f"l{i}", 10**12, Value(), TARGET),
            rq.TaskAcquire(f"l{i}", 0, "w", 100),
        ]
    memory = _same_on_memory(store, setup)
    passes = [Job(lambda tx: tick(tx, 1000, CONFIG), 1000)]
    assert _round_trips_and_answers(store, memory, passes, tmp_path) == 6
    tasks = store.snapshot()["tasks"]
    assert tasks == memory.snapshot()["tasks"]
    assert [t["state"] for t in tasks] == ["pending"] * 4  # four leases expired


def test_the_begun_transaction_serves_any_next_use_of_the_connection(
    pg_url: str, store: PostgresStore
) -> None:
    """A snapshot (REPEATABLE READ: set first in its transaction), a ping, a reset
    and a failed batch all start from the BEGIN a batch left, or roll it back."""
    put(store, promise("a"))
    assert store.begun
    assert [p["id"] for p in store.snapshot()["promises"]] == ["a"]
    put(store, promise("b"))
    store.ping()
    put(store, promise("c"))
    failed = store.execute([Job(lambda tx: 1 // 0, 0)])
    assert isinstance(failed[0].error, ZeroDivisionError)
    put(store, promise("d"))
    assert [p["id"] for p in store.snapshot()["promises"]] == ["a", "b", "c", "d"]
    store.reset()
    assert store.snapshot()["promises"] == []


def test_an_idle_writer_outlives_the_servers_idle_transaction_timeout(
    pg_url: str, store: PostgresStore
) -> None:
    """The begun transaction waits between batches: the writer's connection turns the
    timeout off for itself; a connection lost meanwhile is reopened by the batch."""
    with raw(pg_url) as c:
        c.autocommit = True
        db = c.execute("SELECT current_database()").fetchone()
        assert db is not None
        c.execute(f'ALTER DATABASE "{db[0]}" SET idle_in_transaction_session_timeout = 100')
        try:
            other = PostgresStore(pg_url)
            try:
                put(other, promise("a"))
                pid = other.conn.info.backend_pid
                time.sleep(0.4)
                put(other, promise("b"))
                assert other.conn.info.backend_pid == pid  # not closed
                c.execute("SELECT pg_terminate_backend(%s)", (pid,))
                time.sleep(0.1)
                # Its next batch finds the connection gone at its first statement (the
                # prefetch), reconnects and runs again.
                create = Job(
                    lambda tx: tx.get_promise("c") or tx.set_promise(promise("c")), 0, ("c",)
                )
                assert [o.error for o in other.execute([create])] == [None]
                assert other.conn.info.backend_pid != pid
                assert [p["id"] for p in other.snapshot()["promises"]] == ["a", "b", "c"]
            finally:
                other.close()
        finally:
            c.execute(f'ALTER DATABASE "{db[0]}" RESET idle_in_transaction_session_timeout')


def test_a_text_array_goes_as_text_with_numbers_exact(pg_url: str) -> None:
    """A batch's columns go as ``TextArray``: text as is (any Unicode but U+0000),
    integers of any size as their decimal text, None as NULL; nothing else passes
    (a bool is an int, and would be stored as neither)."""
    items = ["a", "", 'é\u2028"{,}\\', None, 0, -(2**80), 2**63, "\U0001f600"]
    with raw(pg_url) as c:
        row = c.execute("SELECT %b::text[], %b::text[]", (TextArray(items), TextArray())).fetchone()
        assert row == ([None if v is None else str(v) for v in items], [])
        numbers = c.execute("SELECT %b::text[]::numeric[]", (TextArray([2**70, None, -1]),))
        assert numbers.fetchone() == ([Decimal(2**70), None, Decimal(-1)],)
        with pytest.raises(TypeError, match="str, int or None"):
            c.execute("SELECT %b::text[]", (TextArray([True]),))


def _outbox_rows(pg_url: str) -> dict[int, dict[str, Any]]:
    """Every column of every outbox row but its id, by id."""
    with raw(pg_url) as c:
        cur = c.execute("SELECT * FROM outbox ORDER BY id")
        names = [d.name for d in cur.description or ()]
        return {r[names.index("id")]: dict(zip(names, r, strict=True)) for r in cur}


def test_a_batch_inserts_its_messages_claimed_as_a_claim_would_leave_them(
    pg_url: str, store: PostgresStore
) -> None:
    """The batch's own messages go in already claimed (no claim statement, no second
    version of each row); an older pending row is left for the delivery's sweep."""
    run(store, lambda tx: tx.set_message("poll://any@g", Execute("t0", 0)))  # row 1, pending
    claim = BatchClaim("w", 0, 10, "tok")
    run(
        store,
        lambda tx: [tx.set_message("poll://any@g", Execute(f"t{i}", 0)) for i in (1, 2)],
        claim_in_batch=lambda: claim,
    )
    claimed = store.take_claimed()
    assert claimed is not None and [r.id for r in claimed] == [2, 3]
    assert [r.entry.message for r in claimed] == [Execute("t1", 0), Execute("t2", 0)]
    assert _outbox_states(pg_url) == {
        1: ("pending", None),
        2: ("dispatching", "tok"),
        3: ("dispatching", "tok"),
    }
    # Row for row what a claim after the commit leaves (row 4 goes that way).
    run(store, lambda tx: tx.set_message("poll://any@g", Execute("t3", 0)))
    later = store.outbox.claim_due("w", 0, 10, "tok")
    assert [r.id for r in later] == [1, 4]
    rows = _outbox_rows(pg_url)
    inserted, updated = rows[2], rows[4]
    for column in ("id", "key", "task_id"):
        del inserted[column], updated[column]
    assert inserted == updated
    # And what the batch hands the delivery is what the claim returns.
    assert dataclasses.replace(claimed[0], id=4, entry=later[1].entry) == later[1]


def test_a_message_claimed_on_insert_replaces_the_pending_row_of_its_key(
    pg_url: str, store: PostgresStore
) -> None:
    run(store, lambda tx: tx.set_message("poll://any@g", Execute("t", 0)))
    claim = BatchClaim("w", 0, 10, "tok")
    run(
        store,
        lambda tx: tx.set_message("poll://any@g", Execute("t", 1)),
        claim_in_batch=lambda: claim,
    )
    claimed = store.take_claimed()
    assert claimed is not None and [(r.id, r.entry.message) for r in claimed] == [
        (2, Execute("t", 1))
    ]
    assert _outbox_states(pg_url) == {2: ("dispatching", "tok")}  # one row of the key


def test_messages_not_all_this_nodes_to_take_go_to_the_claim_statement(
    pg_url: str, store: PostgresStore
) -> None:
    """Not due yet, more than the limit, or (on a node of several) for a group or id
    this node does not hold: the claim statement decides, and takes older due rows
    with them."""
    store.outbox.routing = Routing("n1", 5_000, lambda: (["g"], ["h/w1"]))
    run(store, lambda tx: tx.set_message("poll://any@far", Execute("old", 0)))  # row 1

    def claim_of(address: str, id: str, claim: BatchClaim) -> list[int]:
        run(store, lambda tx: tx.set_message(address, Execute(id, 0)), claim_in_batch=lambda: claim)
        claimed = store.take_claimed()
        assert claimed is not None
        return [r.id for r in claimed]

    assert claim_of("poll://any@g", "a", BatchClaim("w", 0, 10, "t1")) == [2]  # on insert
    assert claim_of("poll://uni@h/w1", "b", BatchClaim("w", 0, 10, "t2")) == [3]  # on insert
    assert claim_of("poll://any@g", "c", BatchClaim("w", -1, 10, "t3")) == []  # not due
    # A group no node holds, an id held elsewhere for all this node knows: the claim
    # statement, which takes the older row as well (and row 4, due now).
    assert claim_of("poll://uni@h/w2", "d", BatchClaim("w", 0, 10, "t4")) == [1, 4, 5]
    assert claim_of("poll://any@g", "e", BatchClaim("w", 0, 0, "t5")) == []  # the limit
    assert _outbox_states(pg_url)[6] == ("pending", None)


def test_a_failed_write_beside_a_claim_is_still_pinned_on_its_job(
    pg_url: str, store: PostgresStore
) -> None:
    """The claim goes out with the batch's writes; when one of those fails, the batch
    runs again without the claim, then writing job by job: only the job that wrote
    it fails, its neighbours commit (their messages left for the claim after the
    commit)."""
    claim = BatchClaim("w", 0, 10, "tok")
    huge = "".join(random.Random(7).choices(string.ascii_letters, k=20_000))

    def write(id: str) -> Callable[[Overlay], str]:
        def job(tx: Overlay) -> str:
            tx.set_promise(promise(id))
            tx.set_message("poll://any@g", Execute(id[:8], 0))
            return id[:8]

        return job

    jobs = [Job(write("a"), 0), Job(write(huge), 0), Job(write("c"), 0)]
    outcomes = store.execute(jobs, lambda: claim)
    assert [o.value for o in outcomes] == ["a", None, "c"]
    assert isinstance(outcomes[1].error, psycopg.Error)
    assert store.take_claimed() is None and store.reruns == 3  # unclaimed, careful, without
    assert sorted(_outbox_states(pg_url).values()) == [("pending", None)] * 2


def test_two_dispatch_nodes_never_claim_the_same_row(
    nodes: Callable[[int], list[PostgresStore]],
) -> None:
    stores = nodes(4)

    def send(tx: Overlay) -> None:
        for i in range(400):
            tx.set_message("poll://any@g", Execute(f"t{i}", 0))

    run(stores[0], send)
    claimed: dict[int, list[int]] = defaultdict(list)
    start = threading.Barrier(len(stores))

    def dispatcher(k: int) -> None:
        start.wait()
        while rows := stores[k].outbox.claim_due(f"w{k}", 0, 7, f"tok{k}"):
            claimed[k] += [r.id for r in rows]
            settled = stores[k].outbox.settle(
                [Settlement(r.id, f"tok{k}", RowState.COMPLETED, 1) for r in rows]
            )
            assert all(settled)

    threads = [threading.Thread(target=dispatcher, args=(k,)) for k in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    every = [i for ids in claimed.values() for i in ids]
    assert sorted(every) == list(range(1, 401))  # each row once, by exactly one node
    assert len([k for k in claimed if claimed[k]]) > 1
    assert {r["state"] for r in stores[0].snapshot()["outbox"]} == {"completed"}


# -- many clients, the same ids -----------------------------------------------------------------------

CONFIG = Config()
TARGET = {"resonate:target": "poll://any@g"}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize("declared", [True, False], ids=["keys", "no-keys"])
def test_many_nodes_hitting_the_same_ids(
    nodes: Callable[[int], list[PostgresStore]], declared: bool
) -> None:
    """8 nodes × 200 requests (create, acquire, release, settle, get) over a few ids at a
    time, in random group-commit batches: no error and no 500, and every answer fits
    one serial history: each promise born once, each task version acquired once,
    every settle answered with the one winning value.  With the requests' ids
    declared (as the engine does) and without (locks taken in the machine's order,
    conflicts resolved by re-runs)."""
    n_nodes, n_requests = 8, 200
    stores = nodes(n_nodes)
    start = threading.Barrier(n_nodes)
    log: list[tuple[str, str, Response]] = []
    failures: list[BaseException] = []

    def node(k: int) -> None:
        rng = random.Random(k)
        versions: dict[str, int] = defaultdict(int)  # what this client last saw
        start.wait()
        i = 0
        while i < n_requests:
            batch: list[tuple[str, str, rq.Req]] = []
            for _ in range(min(rng.randint(1, 6), n_requests - i)):
                id = f"p{i // 25}-{rng.randrange(3)}"
                kind = rng.choices(
                    ["create", "acquire", "release", "settle", "get"], [3, 4, 3, 1, 2]
                )[0]
                req: rq.Req
                if kind == "create":
                    req = rq.PromiseCreate(id, 10**12, Value(data=b64(f"{k}.{i}")), TARGET)
                elif kind == "acquire":
                    req = rq.TaskAcquire(id, versions[id], f"w{k}", 10**9)
                elif kind == "release":
                    req = rq.TaskRelease(id, versions[id])
                elif kind == "settle":
                    req = rq.PromiseSettle(id, "resolved", Value(data=b64(f"{k}.{i}")))
                else:
                    req = rq.TaskGet(id)
                batch.append((kind, id, req))
                i += 1
            now = 1_000_000 + i
            jobs = [
                Job(
                    lambda tx, req=req, now=now: handle(tx, req, now, CONFIG, {}),
                    now,
                    lock_keys(req) if declared else (),
                )
                for _, _, req in batch
            ]
            for (kind, id, _), outcome in zip(batch, stores[k].execute(jobs), strict=True):
                if outcome.error is not None:
                    failures.append(outcome.error)
                    continue
                response: Response = outcome.value
                log.append((kind, id, response))
                if kind in ("acquire", "get") and response.status == 200:
                    task: TaskRecord = response.data["task"]  # type: ignore[index]
                    versions[id] = task.version

    threads = [threading.Thread(target=node, args=(k,)) for k in range(n_nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    assert failures == []
    assert len(log) == n_nodes * n_requests
    assert all(r.status != 500 for _, _, r in log)

    snap = stores[0].snapshot()
    stored = {p["id"]: p for p in snap["promises"]}
    tasks = {t["id"]: t for t in snap["tasks"]}
    acquired: dict[str, list[int]] = defaultdict(list)
    for kind, id, r in log:
        assert r.status in (200, 404, 409), (kind, id, r)
        if r.status != 200:
            continue
        if kind in ("create", "settle"):
            p: PromiseRecord = r.data["promise"]  # type: ignore[index]
            # Born once: every answer carries the one stored param; one settle won.
            assert {"data": p.param.data} == stored[id]["param"], (kind, id)
            if p.state != "pending":
                assert {"data": p.value.data} == stored[id]["value"], (kind, id)
        elif kind == "acquire":
            acquired[id].append(r.data["task"].version)  # type: ignore[index]
    for id, got in acquired.items():
        # Each version acquired exactly once, and the stored task counts them all.
        assert sorted(got) == list(range(1, tasks[id]["version"] + 1)), id
    assert sum(len(v) for v in acquired.values()) > n_nodes  # the test did contend
    print(f"retries={sum(s.retries for s in stores)} reruns={sum(s.reruns for s in stores)}")


# -- configuration ---------------------------------------------------------------------------------


def test_settings_open_a_postgres_store(pg_url: str) -> None:
    s = open_store(Settings(store="postgres", postgres_url=pg_url))
    try:
        assert isinstance(s, Store) and s.name == "postgres"
        s.ping()
    finally:
        s.close()
    with pytest.raises(ConfigError, match="postgres_url"):
        Settings(store="postgres")


def test_an_unreachable_server_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/helpers/pg.py raises (never skips) when PostgreSQL is down, naming the fix."""
    monkeypatch.setattr(pg, "ADMIN_URL", "postgresql://postgres@127.0.0.1:1/postgres")
    with pytest.raises(RuntimeError, match="pg_ctlcluster"):
        pg.create_database()


def test_version_2_promises_get_their_origin_on_upgrade_and_searches_use_it() -> None:
    """Version 3 derives ``origin`` from the tags; rows written before it are filled in,
    and a search by ``resonate:origin`` answers the same through the index."""
    v1, v2 = migrations()[:2]
    with pg.throwaway_database() as url:
        with raw(url) as conn:
            conn.execute(
                "CREATE TABLE schema_version (version INTEGER PRIMARY KEY,"
                " name TEXT NOT NULL, applied_at BIGINT NOT NULL)"
            )
            conn.execute(v1.sql)
            conn.execute(v2.sql)
            conn.execute(
                "INSERT INTO schema_version VALUES (1, %s, 0), (2, %s, 0)", (v1.name, v2.name)
            )
            for id, tags in [
                ("wf", {"resonate:origin": "wf"}),
                ("wf:1", {"resonate:origin": "wf", "k": "v"}),
                ("other", {"resonate:origin": "other"}),
                ("loose", {}),
            ]:
                conn.execute(
                    "INSERT INTO promises (id, state, param, value, tags, timeout_at, created_at,"
                    " callbacks, listeners, external, undrained) VALUES"
                    " (%s, 'pending', '{}', '{}', %s, 9, 1, '[]', '[]', false, false)",
                    (id, json.dumps(tags)),
                )
        store = PostgresStore(url)
        try:
            with raw(url) as conn:
                origins = dict(conn.execute("SELECT id, origin FROM promises").fetchall())
            assert origins == {"wf": "wf", "wf:1": "wf", "other": "other", "loose": None}

            def search(tags: dict[str, str]) -> list[str]:
                return [p.id for p in run(store, lambda tx: tx.scan_promises(None, tags, None, 10))]

            assert search({"resonate:origin": "wf"}) == ["wf", "wf:1"]
            assert search({"resonate:origin": "wf", "k": "v"}) == ["wf:1"]
            assert search({"resonate:origin": "nobody"}) == []
            assert search({"resonate:origin": "wf\x00"}) == []
        finally:
            store.close()
