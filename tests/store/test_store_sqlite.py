"""What only the SQLite backend has: a file, pragmas, migrations, transactions.

The behaviour shared with the memory backend is in test_store_contract.py.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from troth.protocol.records import Execute, Promise, Schedule, Task, Unblock, Value
from troth.store.base import Job, Overlay
from troth.store.faults import StoreUnavailable
from troth.store.outbox import settle_one
from troth.store.sql.codec import PROMISE_COLS
from troth.store.sql.migrate import Migration, SchemaError, SchemaTooNew, load_migrations
from troth.store.sql.queries import load_queries
from troth.store.sqlite import SqliteStore
from troth.store.sqlite.backend import CODEC, scan_sql
from troth.store.sqlite.migrate import split_statements

FIXTURES = Path(__file__).parent / "fixtures"


def migrations() -> tuple[Migration, ...]:
    return load_migrations("troth.store.sqlite")


def latest_version() -> int:
    return len(migrations())


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "troth.db"


@pytest.fixture
def store(db: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(db)
    yield s
    s.close()


def run(store: SqliteStore, fn: Any, now: int = 0) -> Any:
    outcome = store.execute([Job(fn, now)])[0]
    if outcome.error is not None:
        raise outcome.error
    return outcome.value


def pending(id: str, **kw: Any) -> Promise:
    fields: dict[str, Any] = {
        "state": "pending",
        "param": Value(),
        "value": Value(),
        "tags": {"resonate:external": "true"},
        "timeout_at": 1000,
        "created_at": 0,
    }
    fields.update(kw)
    return Promise(id=id, **fields)


def raw(path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read the file with a plain connection, independent of the store under test."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


# -- durability and connection settings ---------------------------------------------------


def test_data_survives_close_and_reopen(db: Path) -> None:
    p = pending("p", callbacks=("x",), listeners=("poll://any@l",))
    s = SqliteStore(db)

    def job(tx: Overlay) -> None:
        tx.set_promise(p)
        tx.set_task(Task("p", "acquired", 2, ttl=10, pid="w", expires_at=20, resumes=("a",)))
        tx.set_message("poll://any@g", Execute("p", 2))

    run(s, job, now=5)
    before = s.snapshot()
    s.close()

    reopened = SqliteStore(db)
    try:
        assert run(reopened, lambda tx: tx.get_promise("p")) == p
        assert reopened.snapshot() == before
        assert run(reopened, lambda tx: tx.next_deadline()) == 20
    finally:
        reopened.close()


@pytest.mark.parametrize(("mode", "level"), [("full", 2), ("normal", 1), ("FULL", 2)])
def test_wal_and_synchronous_in_force(db: Path, mode: str, level: int) -> None:
    s = SqliteStore(db, synchronous=mode)
    try:
        assert s.conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert s.conn.execute("PRAGMA synchronous").fetchone() == (level,)
        assert s.conn.execute("PRAGMA busy_timeout").fetchone() == (5000,)
        assert s.conn.isolation_level is None
    finally:
        s.close()
    assert raw(db, "PRAGMA journal_mode") == [("wal",)]  # WAL is persistent


@pytest.mark.parametrize("mode", ["off", "extra", "", "fullest"])
def test_unknown_synchronous_mode_refused(db: Path, mode: str) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        SqliteStore(db, synchronous=mode)
    assert not db.exists()  # refused before the file is created


def test_in_memory_database() -> None:
    s = SqliteStore(":memory:")
    try:
        run(s, lambda tx: tx.set_promise(pending("p")))
        assert run(s, lambda tx: tx.get_promise("p")) == pending("p")
        assert s.conn.execute("PRAGMA journal_mode").fetchone() == ("memory",)
        assert s.schema_version() == latest_version()
    finally:
        s.close()


def test_ping_and_close(store: SqliteStore) -> None:
    store.ping()
    store.close()
    with pytest.raises(StoreUnavailable):
        store.ping()


def test_used_from_another_thread(store: SqliteStore) -> None:
    result: list[Any] = []

    def worker() -> None:
        run(store, lambda tx: tx.set_promise(pending("t")))
        result.append(run(store, lambda tx: tx.get_promise("t")))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert result == [pending("t")]


def test_inline_read_of_two_rows_sees_one_snapshot(store: SqliteStore) -> None:
    """A job that reads twice runs again in one read transaction: a commit between its
    two reads must not give it one row from before and one from after."""
    run(store, lambda tx: (tx.set_promise(pending("a")), tx.set_promise(pending("b"))))
    settled = [False]

    def both(tx: Overlay) -> tuple[str, str]:
        a = tx.get_promise("a")
        if not settled[0]:
            settled[0] = True  # another request commits, between this job's two reads
            run(
                store,
                lambda w: [w.set_promise(pending(id, state="resolved")) for id in "ab"],
            )
        b = tx.get_promise("b")
        assert a is not None and b is not None
        return a.state, b.state

    first = store.read_inline(both)
    assert first[0] == first[1], first  # both from before the commit, or both after
    assert store.read_inline(both) == ("resolved", "resolved")


def test_inline_read_error_is_the_jobs_own(store: SqliteStore) -> None:
    """A job's own exception reaches its caller (not as "reader busy"), and the next
    read runs as usual."""

    def broken(tx: Overlay) -> None:
        tx.get_promise("a")
        raise ValueError("the job's own")

    with pytest.raises(ValueError, match="the job's own"):
        store.read_inline(broken)
    run(store, lambda tx: tx.set_promise(pending("a")))
    assert store.read_inline(lambda tx: tx.get_promise("a")) == pending("a")


def test_a_settle_writes_the_row_a_full_write_would(store: SqliteStore, db: Path) -> None:
    """A settle of a promise the batch read updates only the columns a settle changes
    (``settle_promise``); the stored row must be the full write's, byte for byte —
    ``undrained`` included (a settled promise with callbacks) — and a write that
    changes anything else takes the full write."""
    with_callbacks = pending("a", callbacks=("b",), tags={"resonate:origin": "r"})
    run(store, lambda tx: (tx.set_promise(with_callbacks), tx.set_promise(pending("c"))))
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)

    def settle(tx: Overlay) -> None:
        for id in ("a", "c"):
            p = tx.get_promise(id)
            assert p is not None
            tx.set_promise(msgspec.structs.replace(p, state="resolved", settled_at=7))
        c = tx.get_promise("c")
        assert c is not None
        tx.set_promise(msgspec.structs.replace(c, tags={"x": "y"}))  # not a settle

    run(store, settle)
    store.conn.set_trace_callback(None)
    assert sum(s.startswith("UPDATE promises SET state") for s in statements) == 1
    assert sum(s.startswith("INSERT INTO promises") for s in statements) == 1
    expected = {
        "a": msgspec.structs.replace(with_callbacks, state="resolved", settled_at=7),
        "c": msgspec.structs.replace(pending("c"), state="resolved", settled_at=7, tags={"x": "y"}),
    }
    for id, p in expected.items():
        [row] = raw(db, "SELECT * FROM promises WHERE id = ?", (id,))
        assert row == (*CODEC.promise_row(p), None)  # trace: NULL, tracing is off
    [(undrained,)] = raw(db, "SELECT undrained FROM promises WHERE id = 'a'")
    assert undrained == 1


def test_two_stores_share_one_file(db: Path) -> None:
    a, b = SqliteStore(db), SqliteStore(db)
    try:
        run(a, lambda tx: tx.set_message("poll://any@g", Execute("t", 1)))
        run(b, lambda tx: tx.set_message("poll://any@g", Execute("t", 2)))
        rows = a.snapshot()["outbox"]
        assert [(r["id"], r["message"]["version"]) for r in rows] == [(2, 2)]
    finally:
        a.close()
        b.close()


def test_big_integers_are_blobs_that_sort_after_every_integer(store: SqliteStore) -> None:
    huge, huger = 2**64 + 1, 10**30
    run(store, lambda tx: tx.set_promise(pending("h2", timeout_at=huger)))
    run(store, lambda tx: tx.set_promise(pending("h1", timeout_at=huge)))
    run(store, lambda tx: tx.set_promise(pending("n", timeout_at=2**63 - 1)))
    types = store.conn.execute("SELECT id, typeof(timeout_at) FROM promises ORDER BY id")
    assert types.fetchall() == [("h1", "blob"), ("h2", "blob"), ("n", "integer")]
    assert run(store, lambda tx: tx.due_promises(2**63 - 1, 10)) == ["n"]
    assert run(store, lambda tx: tx.due_promises(huger, 10)) == ["n", "h1", "h2"]
    run(store, lambda tx: tx.set_promise(pending("n", state="resolved", settled_at=1)))
    assert run(store, lambda tx: tx.next_deadline()) == huge
    with pytest.raises(OverflowError):
        run(store, lambda tx: tx.set_promise(pending("neg", timeout_at=-(2**63) - 1)))


# -- transactions ------------------------------------------------------------------------------


def test_failing_apply_rolls_back_that_job_only(store: SqliteStore) -> None:
    """apply() fails half way (promise written, then the task cannot be stored)."""

    def good(name: str) -> Any:
        return lambda tx: tx.set_promise(pending(name))

    def bad(tx: Overlay) -> None:
        tx.set_promise(pending("bad"))
        tx.set_message("poll://any@g", Execute("bad", 0))
        tx.set_task(Task("bad", "pending", -(2**70)))  # unstorable

    outcomes = store.execute([Job(good("a"), 0), Job(bad, 0), Job(good("c"), 0)])
    assert [o.error is None for o in outcomes] == [True, False, True]
    assert isinstance(outcomes[1].error, OverflowError)
    snap = store.snapshot()
    assert [p["id"] for p in snap["promises"]] == ["a", "c"]
    assert snap["tasks"] == [] and snap["outbox"] == []
    # The batch was re-run without it: the next batch starts clean.
    assert not store.conn.in_transaction
    run(store, good("d"))
    assert len(store.snapshot()["promises"]) == 3


def test_commit_failure_fails_every_job_and_leaves_nothing(db: Path) -> None:
    store = SqliteStore(db)
    run(store, lambda tx: tx.set_promise(pending("before")))

    def write(name: str) -> Any:
        return lambda tx: tx.set_promise(pending(name))

    def sabotage(tx: Overlay) -> None:
        tx.set_promise(pending("sabotage"))
        store.conn.close()  # the COMMIT of this batch cannot happen

    outcomes = store.execute([Job(write("a"), 0), Job(sabotage, 0), Job(write("c"), 0)])
    assert len(outcomes) == 3
    assert all(o.error is not None for o in outcomes)
    assert all(o.value is None for o in outcomes)
    assert raw(db, "SELECT id FROM promises") == [("before",)]


def test_commit_error_rolls_back(store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_commit() -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(store, "commit", failing_commit)

    def write(id: str) -> Any:
        return lambda tx: tx.set_promise(pending(id))

    outcomes = store.execute([Job(write("a"), 0), Job(write("b"), 0)])
    assert [str(o.error) for o in outcomes] == ["disk I/O error"] * 2
    assert not store.conn.in_transaction
    monkeypatch.undo()
    assert store.snapshot()["promises"] == []
    run(store, lambda tx: tx.set_promise(pending("after")))
    assert [p["id"] for p in store.snapshot()["promises"]] == ["after"]


# -- migrations -----------------------------------------------------------------------------


def test_fresh_database_is_at_latest_version(store: SqliteStore, db: Path) -> None:
    assert latest_version() == len(migrations()) == 12
    rows = raw(db, "SELECT version, name, applied_at FROM schema_version ORDER BY version")
    assert [(v, n) for v, n, _ in rows] == [
        (1, "core"),
        (2, "outbox_delivery"),
        (3, "origin"),
        (4, "inspection"),
        (5, "retention"),
        (6, "rolling_upgrades"),
        (7, "trace_context"),
        (8, "flow_control"),
        (9, "rate_limits"),
        (10, "fairness"),
        (11, "outbox_unknown"),
        (12, "outbox_claimed"),
    ]
    assert all(isinstance(at, int) and at > 1_600_000_000_000 for _, _, at in rows)
    assert store.schema_version() == 12
    indexes = {r[0] for r in raw(db, "SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {
        "promises_timeout",
        "promises_branch",
        "promises_undrained",
        "tasks_retry",
        "tasks_expiry",
        "schedules_next_run",
        "outbox_pending_key",
        "outbox_state_available",
        "outbox_unknown",
        "outbox_claimed",
        "promises_origin",
    } <= indexes


def test_reopening_runs_nothing_again(db: Path) -> None:
    SqliteStore(db).close()
    first = raw(db, "SELECT * FROM schema_version")
    SqliteStore(db).close()
    assert raw(db, "SELECT * FROM schema_version") == first


def build_v1(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.executescript((FIXTURES / "schema_v1.sql").read_text(encoding="utf-8"))
    finally:
        conn.close()


def test_fixture_upgrade_from_version_1(db: Path) -> None:
    build_v1(db)
    assert raw(db, "SELECT max(version) FROM schema_version") == [(1,)]

    store = SqliteStore(db)
    try:
        assert store.schema_version() == latest_version()
        versions = raw(db, "SELECT version, name FROM schema_version ORDER BY version")
        assert versions == [
            (1, "core"),
            (2, "outbox_delivery"),
            (3, "origin"),
            (4, "inspection"),
            (5, "retention"),
            (6, "rolling_upgrades"),
            (7, "trace_context"),
            (8, "flow_control"),
            (9, "rate_limits"),
            (10, "fairness"),
            (11, "outbox_unknown"),
            (12, "outbox_claimed"),
        ]
        assert raw(db, "SELECT applied_at FROM schema_version WHERE version = 1") == [
            (1_700_000_000_000,)
        ]

        # Old rows are intact and decode into the exact Structs.
        tags = {
            "resonate:target": "poll://any@g",
            "resonate:branch": "root",
            "resonate:origin": "root",
        }
        assert run(store, lambda tx: tx.get_promise("p-pending")) == Promise(
            id="p-pending",
            state="pending",
            param=Value({"k": "v"}, "aGk="),
            value=Value(),
            tags=tags,
            timeout_at=5000,
            created_at=1000,
            listeners=("poll://any@l",),
        )
        resolved = run(store, lambda tx: tx.get_promise("p-resolved"))
        assert resolved.settled_at == 1200 and resolved.callbacks == ("root",)
        assert run(store, lambda tx: tx.get_task("root")) == Task(
            "root", "acquired", 2, ttl=30000, pid="w1", expires_at=31000, resumes=("p-resolved",)
        )
        assert run(store, lambda tx: tx.get_schedule("s1")) == Schedule(
            id="s1",
            cron="*/5 * * * *",
            promise_id="s1.{{.timestamp}}",
            promise_timeout=60000,
            promise_param=Value(),
            promise_tags={"resonate:target": "poll://any@g"},
            created_at=0,
            next_run_at=300000,
        )
        # The indexes of version 1 still answer.
        assert run(store, lambda tx: tx.due_promises(9000, 10)) == ["p-pending", "root"]
        assert run(store, lambda tx: tx.due_tasks(31000, 10)) == ["p-pending", "root"]
        assert run(store, lambda tx: tx.undrained_promises(10)) == ["p-resolved"]
        assert run(store, lambda tx: tx.next_deadline()) == 0
        branch = run(store, lambda tx: tx.promises_in_branch("root", 10))
        assert [p.id for p in branch] == ["p-pending", "p-resolved", "root"]

        # Old outbox rows are pending now, available since they were created.
        rows = raw(
            db, "SELECT id, key, state, attempts, available_at, updated_at FROM outbox ORDER BY id"
        )
        assert rows == [
            (1, "p-pending", "pending", 0, 1000, 1000),
            (3, "p-resolved:notify:poll://any@l", "pending", 0, 1200, 1200),
        ]
        unblock = store.snapshot()["outbox"][1]["message"]
        assert unblock["kind"] == "unblock" and unblock["promise"]["settledAt"] == 1200

        # Keyed upsert works on the migrated table, and ids never go back (seq was 4).
        run(store, lambda tx: tx.set_message("poll://any@g", Execute("p-pending", 1)), now=2000)
        rows = raw(db, "SELECT id, key, version, created_at FROM outbox ORDER BY id")
        assert rows == [
            (3, "p-resolved:notify:poll://any@l", None, 1200),
            (5, "p-pending", 1, 2000),
        ]

        # A claimed row may coexist with a newer pending row of the same key ...
        store.conn.execute("UPDATE outbox SET state = 'claimed' WHERE id = 5")
        run(store, lambda tx: tx.set_message("poll://any@g", Execute("p-pending", 2)), now=3000)
        rows = raw(db, "SELECT id, key, state FROM outbox WHERE key = 'p-pending' ORDER BY id")
        assert rows == [(5, "p-pending", "claimed"), (6, "p-pending", "pending")]
        # ... but there is never a second pending row for one key.
        with pytest.raises(sqlite3.IntegrityError):
            store.conn.execute(
                "INSERT INTO outbox (key, address, kind, created_at) "
                "VALUES ('p-pending', 'x', 'execute', 0)"
            )
        rec = resolved.record()
        run(store, lambda tx: tx.set_message("poll://any@l", Unblock(rec)), now=4000)
        assert raw(db, "SELECT id FROM outbox WHERE key LIKE 'p-resolved:%'") == [(7,)]
    finally:
        store.close()


def test_newer_database_is_refused_untouched(db: Path) -> None:
    SqliteStore(db).close()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.execute("INSERT INTO schema_version VALUES (99, 'from_the_future', 0)")
    conn.close()
    before = raw(db, "SELECT * FROM schema_version ORDER BY version")

    with pytest.raises(SchemaTooNew, match=r"version 99 is newer .* \(12\)") as info:
        SqliteStore(db)
    assert info.value.found == 99 and info.value.known == 12
    assert raw(db, "SELECT * FROM schema_version ORDER BY version") == before
    assert raw(db, "PRAGMA journal_mode") == [("delete",)]  # not even switched to WAL


def test_failed_migration_leaves_the_previous_version(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A migration that fails half way is rolled back whole; the next open retries."""
    build_v1(db)
    real = migrations()
    broken = Migration(2, "outbox_delivery", real[1].sql + "\nSELECT no_such_function();\n")
    monkeypatch.setattr("troth.store.sql.migrate.load_migrations", lambda _: (real[0], broken))
    with pytest.raises(sqlite3.OperationalError):
        SqliteStore(db)
    assert raw(db, "SELECT max(version) FROM schema_version") == [(1,)]
    assert "claim_token" not in str(raw(db, "SELECT sql FROM sqlite_master"))
    monkeypatch.undo()
    SqliteStore(db).close()
    assert raw(db, "SELECT max(version) FROM schema_version") == [(12,)]


def test_split_statements() -> None:
    script = (
        "-- a comment; with a semicolon\n"
        "CREATE TABLE t (x TEXT DEFAULT 'a;b');\n"
        "INSERT INTO t VALUES ('--;');  -- trailing\n"
        "-- the end\n"
    )
    assert split_statements(script) == [
        "-- a comment; with a semicolon\nCREATE TABLE t (x TEXT DEFAULT 'a;b');",
        "INSERT INTO t VALUES ('--;');  -- trailing",
    ]
    with pytest.raises(SchemaError, match="incomplete"):
        split_statements("CREATE TABLE t (x)\n")


# -- every query uses an index ------------------------------------------------------------------


class Recorder:
    """Stands in for the connection and records every statement the store runs."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.seen: list[tuple[str, tuple[Any, ...]]] = []

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        self.seen.append((sql, tuple(params)))
        return self.conn.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def test_every_query_uses_an_index(store: SqliteStore) -> None:
    recorder = Recorder(store.conn)
    store.conn = store.backend.conn = recorder  # type: ignore[assignment]

    def everything(tx: Overlay) -> None:
        tx.set_promise(pending("p", tags={"resonate:branch": "b", "resonate:target": "x"}))
        tx.set_task(Task("p", "pending", 0, retry_at=1))
        tx.set_schedule(Schedule("s", "* * * * *", "s.x", 1, Value(), {}, 0, 5))
        tx.del_schedule("gone")
        tx.set_message("poll://any@g", Execute("p", 0))
        tx.set_message("poll://any@h", Execute("q", 0))

    run(store, everything)

    def queries(tx: Overlay) -> None:
        tx.get_promise("p")
        tx.get_task("p")
        tx.get_schedule("s")
        tx.scan_promises(None, {}, None, 10)
        tx.scan_promises({"pending", "resolved"}, {"resonate:origin": "o"}, "a", 10)
        tx.scan_tasks({"pending"}, "a", 10)
        tx.scan_tasks(None, None, 10)
        tx.scan_schedules({"k": "v"}, "a", 10)
        tx.promises_in_branch("b", 10)
        tx.due_promises(10, 10)
        tx.due_tasks(10, 10)
        tx.due_schedules(10, 10)
        tx.undrained_promises(10)
        tx.next_deadline()

    store.read(queries)
    life = store.outbox
    first, second = life.claim_due("w", 0, 10, "tok")
    settle_one(life, first.id, "tok", "pending", 1, "c", 5)
    settle_one(life, second.id, "tok", "outcome_unknown", 1, "c")
    life.unknown_rows(10)
    settle_one(life, second.id, None, "completed", 2, None)
    life.release_expired_claims(0, 3, "expired")
    life.purge_completed(10)
    life.next_due()

    statements = [(q, p) for q, p in recorder.seen if q.startswith(("SELECT", "UPDATE", "DELETE"))]
    assert len(statements) >= 25
    for sql, params in statements:
        plan = [r[3] for r in store.conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
        for step in plan:
            if "TEMP B-TREE" in step:
                # Rows of unknown outcome are few (at most the claims in flight when a
                # dispatcher died), so sorting them by id is cheaper than an index.
                assert "state = 'outcome_unknown'" in sql, (sql, plan)
            if step.startswith("SCAN ") and step not in ("SCAN CONSTANT ROW",):
                # Walking a whole table is only acceptable in id order through its
                # primary-key index (a scan without filter); json_each is per row.
                ok = "VIRTUAL TABLE" in step or ("USING" in step and "INDEX" in step)
                assert ok, (sql, plan)


def test_timer_queries_use_their_partial_indexes(store: SqliteStore) -> None:
    q = load_queries("troth.store.sqlite")

    def plan(sql: str, params: tuple[Any, ...]) -> str:
        return " | ".join(r[3] for r in store.conn.execute("EXPLAIN QUERY PLAN " + sql, params))

    assert "promises_timeout" in plan(q["due_promises"], (1, 1))
    due_tasks = plan(q["due_tasks"], (1, 1))
    assert "tasks_retry" in due_tasks and "tasks_expiry" in due_tasks
    assert "MERGE" in due_tasks
    assert "schedules_next_run" in plan(q["due_schedules"], (1, 1))
    assert "promises_undrained" in plan(q["undrained_promises"], (1,))
    assert "promises_branch" in plan(q["promises_in_branch"], ("b", 1))
    nd = plan(q["next_deadline"], ())
    for index in (
        "promises_undrained",
        "promises_timeout",
        "tasks_retry",
        "tasks_expiry",
        "schedules_next_run",
    ):
        assert index in nd
    assert "outbox_pending_key" in plan(q["delete_pending_message"], ("k",))


def test_version_3_fills_origin_and_a_search_by_origin_uses_its_index(db: Path) -> None:
    build_v1(db)
    store = SqliteStore(db)
    try:
        origins = dict(raw(db, "SELECT id, origin FROM promises"))
        assert origins["p-pending"] == "root"  # from the fixture's tags
        assert all(
            origin == json.loads(tags).get("resonate:origin")
            for (id, tags), origin in zip(
                raw(db, "SELECT id, tags FROM promises ORDER BY id"),
                [o for _, o in raw(db, "SELECT id, origin FROM promises ORDER BY id")],
                strict=True,
            )
        )
        tags = {"resonate:origin": "root"}
        found = run(store, lambda tx: tx.scan_promises(None, tags, None, 10))
        assert "p-pending" in [p.id for p in found]
        assert all(p.tags.get("resonate:origin") == "root" for p in found)
        # The statement the store runs for that search (built in code: filters vary).
        sql = scan_sql("promises", PROMISE_COLS, None, "tags", 0, True, origin=True)
        plan = " | ".join(
            r[3] for r in store.conn.execute("EXPLAIN QUERY PLAN " + sql, ("root", "", 10))
        )
        assert "promises_origin" in plan and "TEMP B-TREE" not in plan
    finally:
        store.close()
