"""``troth migrate-store``: a SQLite store moved into an empty PostgreSQL database
equals its source (docs/operations.md, "Moving from SQLite to PostgreSQL").

The source holds every kind of row the stores write: random jobs of the store
contract (promises of every state with tags, callbacks and listeners; tasks of every
state; schedules; execute and unblock messages to poll and http addresses), outbox
rows walked through their lifecycle, and integers beyond 64 bits, which SQLite keeps
as BLOBs and PostgreSQL as NUMERIC.  Equality is judged by each store's own
``snapshot()`` and, for what a snapshot leaves out (claims, derived columns), by
the raw rows.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers.pg import throwaway_database
from helpers.store_jobs import BIG, EXT, Model, promise, put, run, schedule
from helpers.support import running_server
from troth.cli.main import main
from troth.outbox.rows import RowState
from troth.protocol.records import Execute, Task, Unblock
from troth.server.config import Settings
from troth.store.base import Job
from troth.store.outbox import settle_one
from troth.store.postgres import PostgresStore
from troth.store.sqlite import SqliteStore

CLAIM_COLUMNS = "id, key, claim_token, claimed_by, claimed_at, updated_at"
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
UNSAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"


@pytest.fixture
def pg_url() -> Iterator[str]:
    with throwaway_database("troth_move") as url:
        yield url


def build_source(path: Path) -> dict[str, Any]:
    """A SQLite store with every kind of row; returns its snapshot."""
    store = SqliteStore(path)
    try:
        model = Model(seed=14)
        for i in range(300):
            store.execute([Job(model.job(), i)])
        put(
            store,
            promise("big", tags=EXT, timeout_at=BIG, created_at=2**63 - 1),
            promise(
                "root.1",
                "resolved",
                tags={"resonate:origin": "root", "resonate:branch": "root"},
                settled_at=10**30,
                callbacks=("root",),
                listeners=("poll://any@x",),
            ),
            Task("big", "acquired", BIG, ttl=BIG, pid="w", expires_at=BIG),
            schedule("nightly", BIG, {"team": "a"}),
        )

        def messages(tx: Any) -> None:
            for i in range(8):
                tx.set_message(f"poll://any@g{i % 2}/w{i}", Execute(f"m{i}", BIG + i))
            tx.set_message("http://hook.example/x", Unblock(promise("big").record()))
            tx.set_message("poll://uni@g/w", Execute("last", 1))

        run(store, messages, now=BIG)
        life = store.outbox
        rows = life.claim_due("node-a", BIG, 6, "tok")
        assert len(rows) == 6
        settle_one(life, rows[0].id, "tok", RowState.COMPLETED, BIG + 10, None)
        settle_one(life, rows[1].id, "tok", RowState.FAILED, BIG, "troth.test.failed")
        settle_one(life, rows[2].id, "tok", RowState.OUTCOME_UNKNOWN, BIG, "troth.test.unknown")
        settle_one(life, rows[3].id, "tok", RowState.PENDING, BIG, "busy", BIG + 50)
        # rows[4], rows[5] stay dispatching under their claim.
        # The newest row delivered and purged: the id high-water mark is above every id left.
        for r in life.claim_due("node-b", 2**200, 1000, "t2"):
            if r.key == "last":
                settle_one(life, r.id, "t2", RowState.COMPLETED, BIG + 1, None)
            else:  # back in the queue, in place
                settle_one(life, r.id, "t2", RowState.PENDING, 1, "busy", 2**70)
        assert life.purge_completed(BIG + 2) == 1  # "last"; rows[0] completed later
        snap = store.snapshot()
    finally:
        store.close()
    conn = sqlite3.connect(path)  # traces kept with two promises (tracing on)
    with conn:
        conn.executemany(
            "UPDATE promises SET trace = ? WHERE id = ?",
            [(TRACE, "big"), (UNSAMPLED, "root.1")],
        )
    conn.close()
    states = {r["state"] for r in snap["outbox"]}
    assert states == {"pending", "dispatching", "completed", "failed", "outcome_unknown"}
    assert {t["state"] for t in snap["tasks"]} >= {"pending", "acquired", "suspended", "fulfilled"}
    assert {p["state"] for p in snap["promises"]} >= {"pending", "resolved", "rejected"}
    assert any(p["callbacks"] for p in snap["promises"])
    assert any(p["listeners"] for p in snap["promises"])
    assert snap["schedules"]
    return snap


def raw_sqlite(path: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return [tuple(r) for r in conn.execute(sql).fetchall()]
    finally:
        conn.close()


def raw_pg(url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


def test_a_moved_store_equals_its_source(
    tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "t.db"
    snap = build_source(db)
    high = raw_sqlite(db, "SELECT seq FROM sqlite_sequence WHERE name = 'outbox'")[0][0]
    assert high > max(r["id"] for r in snap["outbox"])

    assert main(["migrate-store", "--from", f"sqlite:{db}", "--to", pg_url, "--batch", "7"]) == 0
    out = capsys.readouterr().out
    assert "compared row by row" in out
    assert f"next outbox id {high + 1}" in out

    target = PostgresStore(pg_url)
    try:
        assert target.snapshot() == snap
        # Claims and lifecycle columns, which a snapshot leaves out, came along too.
        claims = f"SELECT {CLAIM_COLUMNS} FROM outbox ORDER BY id"
        source_claims = [
            tuple(int.from_bytes(v[4:], "big") if isinstance(v, bytes) else v for v in row)
            for row in raw_sqlite(db, claims)
        ]
        assert raw_pg(pg_url, claims) == source_claims
        # Derived columns as the PostgreSQL store writes them (origin, branch, destinations).
        origin = raw_pg(pg_url, "SELECT origin, branch FROM promises WHERE id = 'root.1'")
        assert origin == [("root", "root")]
        dests = raw_pg(pg_url, "SELECT dest_cast, dest_group, dest_id FROM outbox ORDER BY id")
        assert ("any", "g0", "w0") in dests
        assert (None, None, None) in dests  # the http row
        # The trace contexts kept with promises came along (a record leaves them out).
        traces = "SELECT id, trace FROM promises WHERE trace IS NOT NULL ORDER BY id"
        assert raw_pg(pg_url, traces) == [("big", TRACE), ("root.1", UNSAMPLED)]
        assert re.search(r"^  traces +2$", out, re.M), out
        # New rows get ids past every id the source handed out.
        run(target, lambda tx: tx.set_message("poll://any@g", Execute("new", 0)), now=5)
        new = [r for r in target.snapshot()["outbox"] if r["key"] == "new"]
        assert [r["id"] for r in new] == [high + 1]
    finally:
        target.close()

    # A troth node on the moved database serves the moved promises.
    settings = Settings(store="postgres", postgres_url=pg_url)
    with running_server(settings) as server:
        for p in snap["promises"][:20] + [x for x in snap["promises"] if x["id"] == "big"]:
            got = server.ok("promise.get", {"id": p["id"]})["promise"]
            assert (got["id"], got["tags"], got["timeoutAt"], got["createdAt"]) == (
                p["id"],
                p["tags"],
                p["timeoutAt"],
                p["createdAt"],
            )
            # A read projects a pending promise past its deadline as timed out (SPEC).
            if p["state"] != "pending" or p["timeoutAt"] == BIG:
                assert got["state"] == p["state"], p["id"]


def test_a_target_that_is_not_empty_is_refused_and_left_alone(
    tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "t.db"
    store = SqliteStore(db)
    put(store, promise("a"), promise("b"))
    store.close()
    other = PostgresStore(pg_url)
    put(other, promise("already-here"))
    before = other.snapshot()
    other.close()

    assert main(["migrate-store", "--from", f"sqlite:{db}", "--to", pg_url]) == 1
    assert "the target database is not empty (1 promises)" in capsys.readouterr().err
    other = PostgresStore(pg_url)
    try:
        assert other.snapshot() == before
    finally:
        other.close()


def test_a_second_run_is_refused(tmp_path: Path, pg_url: str) -> None:
    db = tmp_path / "t.db"
    store = SqliteStore(db)
    put(store, promise("a"))
    store.close()
    args = ["migrate-store", "--from", f"sqlite:{db}", "--to", pg_url]
    assert main(args) == 0
    assert main(args) == 1


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--from", "t.db", "--to", "postgresql://x/y"], 2, "--from must be sqlite:PATH"),
        (["--from", "sqlite:t.db", "--to", "sqlite:u.db"], 2, "--to must be a postgresql://"),
        (["--from", "sqlite:missing.db", "--to", "postgresql://x/y"], 1, "no database file"),
    ],
)
def test_bad_arguments(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    code: int,
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["migrate-store", *args]) == code
    assert message in capsys.readouterr().err


def test_a_source_at_an_older_schema_is_refused_untouched(tmp_path: Path, pg_url: str) -> None:
    """The move never writes its source, not even to migrate it."""
    db = tmp_path / "t.db"
    SqliteStore(db).close()
    conn = sqlite3.connect(db)
    conn.execute(
        "DELETE FROM schema_version WHERE version = (SELECT max(version) FROM schema_version)"
    )
    conn.commit()
    conn.close()
    before = db.read_bytes()
    assert main(["migrate-store", "--from", f"sqlite:{db}", "--to", pg_url]) == 1
    assert db.read_bytes() == before


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        ("UPDATE promises SET undrained = true WHERE id = 'a'", "promises row 'a' differs"),
        ("DELETE FROM tasks WHERE id = 't'", "tasks: the source has more rows"),
        ("UPDATE outbox SET dest_group = 'h'", "outbox row 'x' differs"),
        (
            f"UPDATE promises SET trace = '{TRACE}' WHERE id = 'a'",
            "traces: the target has more rows",
        ),
    ],
    ids=["derived-column", "missing-row", "outbox-destination", "trace"],
)
def test_the_comparison_finds_a_difference(
    tmp_path: Path,
    pg_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tamper: str,
    message: str,
) -> None:
    """The check after the copy is not a formality: a target changed between the copy
    and the comparison (here by the test, in place of a bug) fails the move."""
    from troth.store import transfer

    db = tmp_path / "t.db"
    store = SqliteStore(db)
    put(store, promise("a", "resolved", settled_at=1), Task("t", "pending", 0))
    run(store, lambda tx: tx.set_message("poll://any@g/w", Execute("x", 0)))
    store.close()
    copy = transfer._copy

    def copy_then_tamper(source: Any, conn: Any, batch: int, say: Any) -> Any:
        result = copy(source, conn, batch, say)
        conn.execute(tamper)
        conn.commit()
        return result

    monkeypatch.setattr(transfer, "_copy", copy_then_tamper)
    assert main(["migrate-store", "--from", f"sqlite:{db}", "--to", pg_url]) == 1
    assert message in capsys.readouterr().err
