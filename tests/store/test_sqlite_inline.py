"""The event loop's reader holds one read snapshot while nothing is committed
(``store/sqlite/inline.py``): it must still see every commit — this process's, and
another process's — and must not hold up the WAL's restarts."""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
import textwrap
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from troth.protocol.records import Promise, Value
from troth.store.base import Job
from troth.store.faults import StoreUnavailable
from troth.store.sqlite import SqliteStore
from troth.store.sqlite.inline import HOLD, InlineReader, map_header


def on_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test on an event loop of its own (the reader holds a snapshot only
    where a loop can end it)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "troth.db")
    yield s
    s.close()


def pending(id: str, param: bytes = b"") -> Promise:
    return Promise(
        id=id,
        state="pending",
        param=Value(data=param.decode() or None),
        value=Value(),
        tags={},
        timeout_at=10**12,
        created_at=0,
    )


def write(store: SqliteStore, *promises: Promise) -> None:
    outcome = store.execute([Job(lambda tx: [tx.set_promise(p) for p in promises], 0)])[0]
    assert outcome.error is None, outcome.error


def state(store: SqliteStore, id: str) -> str | None:
    p = store.read_inline(lambda tx: tx.get_promise(id))
    return None if p is None else p.state


def reader(store: SqliteStore) -> InlineReader:
    assert store._inline is not None
    return store._inline


def settle_elsewhere(db: Path, id: str) -> None:
    """Settle ``id`` from another process, straight through SQLite."""
    script = textwrap.dedent(
        f"""
        import sqlite3
        conn = sqlite3.connect({str(db)!r}, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("UPDATE promises SET state = 'resolved' WHERE id = ?", ({id!r},))
        conn.close()
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


@on_loop
async def test_a_snapshot_is_held_across_reads_while_nothing_commits(store: SqliteStore) -> None:
    write(store, pending("p"))
    assert state(store, "p") == "pending"  # opens the reader
    statements: list[str] = []
    reader(store).conn.set_trace_callback(statements.append)
    assert state(store, "p") == "pending"
    assert state(store, "q") is None
    assert reader(store).conn.in_transaction
    assert all(s.startswith("SELECT") for s in statements), statements
    assert len(statements) == 2


@on_loop
async def test_a_commit_of_this_process_is_seen_by_the_next_read(store: SqliteStore) -> None:
    write(store, pending("p"))
    assert state(store, "p") == "pending"
    assert reader(store).conn.in_transaction  # held
    write(store, msgspec.structs.replace(pending("p"), state="resolved"))
    assert state(store, "p") == "resolved"


@on_loop
async def test_a_commit_of_another_process_is_seen_by_the_next_read(
    store: SqliteStore, tmp_path: Path
) -> None:
    write(store, pending("p"), pending("q"))
    assert state(store, "p") == "pending"
    assert reader(store).header is not None  # the header is what tells
    settle_elsewhere(tmp_path / "troth.db", "p")
    assert state(store, "p") == "resolved"
    assert state(store, "q") == "pending"


@on_loop
async def test_the_snapshot_is_let_go_after_hold(store: SqliteStore) -> None:
    write(store, pending("p"))
    assert state(store, "p") == "pending"
    assert reader(store).conn.in_transaction
    await asyncio.sleep(HOLD * 3)
    assert not reader(store).conn.in_transaction
    assert state(store, "p") == "pending"  # and a new one is begun
    assert reader(store).conn.in_transaction


@on_loop
async def test_a_batch_begun_on_the_loop_lets_the_snapshot_go(store: SqliteStore) -> None:
    write(store, pending("p"))
    assert state(store, "p") == "pending"
    assert reader(store).conn.in_transaction
    with store.lock:
        store.run_open([Job(lambda tx: tx.set_promise(pending("q")), 0)], nowait=True)
        assert not reader(store).conn.in_transaction
        store.commit()
    assert state(store, "q") == "pending"


def test_without_an_event_loop_every_read_ends_its_snapshot(store: SqliteStore) -> None:
    write(store, pending("p"))
    assert state(store, "p") == "pending"
    assert not reader(store).conn.in_transaction
    write(store, msgspec.structs.replace(pending("p"), state="resolved"))
    assert state(store, "p") == "resolved"


@on_loop
async def test_without_a_header_every_read_ends_its_snapshot(store: SqliteStore) -> None:
    """A ``-shm`` whose header cannot be read (no such file: a database not in WAL
    mode) holds nothing: each read is its own snapshot, as before."""
    write(store, pending("p"))
    assert state(store, "p") == "pending"
    held = reader(store)
    assert held.header is not None
    held.release()
    held.header.close()
    held.header = None
    assert state(store, "p") == "pending"
    assert not held.conn.in_transaction
    write(store, msgspec.structs.replace(pending("p"), state="resolved"))
    assert state(store, "p") == "resolved"


def test_no_header_without_a_wal(tmp_path: Path) -> None:
    assert map_header(str(tmp_path / "missing.db")) is None
    (tmp_path / "short.db-shm").write_bytes(b"\0" * 16)
    assert map_header(str(tmp_path / "short.db")) is None
    (tmp_path / "zero.db-shm").write_bytes(b"\0" * 4096)  # not initialised
    assert map_header(str(tmp_path / "zero.db")) is None


@on_loop
async def test_reads_between_batches_do_not_stop_the_wal_restarting(
    store: SqliteStore, tmp_path: Path
) -> None:
    """A WAL restarts from its start only when no reader holds a mark in it.  Writing
    ~40 MB in batches begun on the loop, with a held read between each two, the WAL
    must stay near its checkpoint size (1000 pages) instead of holding it all."""
    wal = tmp_path / "troth.db-wal"
    write(store, pending("seed"))
    blob = b"x" * 40_000
    for n in range(1000):
        assert state(store, "seed") == "pending"
        with store.lock:
            store.run_open(
                [Job(lambda tx, n=n: tx.set_promise(pending(f"p{n}", blob)), 0)], nowait=True
            )
            store.commit()
    assert state(store, f"p{999}") == "pending"
    assert wal.stat().st_size < 12 * 2**20, wal.stat().st_size


@on_loop
async def test_a_reader_that_cannot_read_holds_nothing(store: SqliteStore) -> None:
    write(store, pending("p"))
    assert state(store, "p") == "pending"
    held = reader(store)

    def broken(_: Any) -> None:
        raise __import__("sqlite3").OperationalError("database is locked (test)")

    with pytest.raises(StoreUnavailable):
        store.read_inline(broken)
    assert not held.conn.in_transaction
    assert state(store, "p") == "pending"


@pytest.mark.parametrize("path", ["inline", "pooled"])
def test_a_read_that_writes_is_refused_and_writes_nothing(store: SqliteStore, path: str) -> None:
    """Read jobs see a ReadOnly view: a write raises where it is tried (a read that
    writes is a bug), on the loop's reader and on the reader threads alike."""
    write(store, pending("p"))

    def writes(tx: Any) -> None:
        tx.get_promise("p")
        tx.set_promise(msgspec.structs.replace(pending("p"), state="resolved"))

    if path == "inline":
        with pytest.raises(RuntimeError, match="read-only job wrote"):
            store.read_inline(writes)
    else:
        [outcome] = store.read_many([Job(writes, 0)])
        assert isinstance(outcome.error, RuntimeError)
    assert state(store, "p") == "pending"


@on_loop
async def test_reads_while_a_commit_is_lent_do_not_stop_the_wal_restarting(
    store: SqliteStore, tmp_path: Path
) -> None:
    """The loop answers reads while a batch's COMMIT is lent to the writer thread.  A
    snapshot held across that COMMIT would hold a mark its checkpoint cannot pass,
    and the WAL would never restart (62 MB here): while a write transaction is open
    every read ends its snapshot."""
    wal = tmp_path / "troth.db-wal"
    write(store, pending("seed"))
    blob = b"x" * 40_000
    for n in range(1000):
        with store.lock:
            store.run_open(
                [Job(lambda tx, n=n: tx.set_promise(pending(f"p{n}", blob)), 0)], nowait=True
            )
            assert state(store, "seed") == "pending"  # as the loop does, mid-batch
            assert not reader(store).conn.in_transaction
            store.commit()
        assert state(store, f"p{n}") == "pending"
        assert reader(store).conn.in_transaction  # held again once committed
    assert wal.stat().st_size < 12 * 2**20, wal.stat().st_size


@on_loop
async def test_a_database_named_by_a_symbolic_link_reads_the_header_beside_its_file(
    tmp_path: Path,
) -> None:
    """SQLite keeps the -shm beside the file the link names; a stale file beside the
    link (whose header never changes) must not be the one read."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").mkdir()
    real = tmp_path / "real" / "troth.db"
    link = tmp_path / "link" / "troth.db"
    SqliteStore(real).close()
    link.symlink_to(real)
    store = SqliteStore(link)
    try:
        write(store, pending("p"))
        assert state(store, "p") == "pending"
        (tmp_path / "link" / "troth.db-shm").write_bytes(
            (tmp_path / "real" / "troth.db-shm").read_bytes()
        )
        held = reader(store)
        assert held.header is not None
        settle_elsewhere(real, "p")
        assert state(store, "p") == "resolved"
    finally:
        store.close()


def test_a_timer_of_an_ended_loop_holds_nothing(store: SqliteStore) -> None:
    """A loop that ended without closing the store leaves a timer that never fires:
    reads after it (without a loop, or on another loop) must not keep a snapshot
    that nothing ends."""
    write(store, pending("p"))

    async def first() -> None:
        assert state(store, "p") == "pending"
        assert reader(store).conn.in_transaction

    asyncio.run(first())
    reader(store).release()
    assert state(store, "p") == "pending"  # no loop now
    assert not reader(store).conn.in_transaction

    async def later() -> None:
        assert state(store, "p") == "pending"
        held = reader(store)
        assert held.conn.in_transaction and held.timer_loop is asyncio.get_running_loop()
        await asyncio.sleep(HOLD * 3)
        assert not held.conn.in_transaction

    asyncio.run(later())
