"""``troth backup``: a consistent, verified copy of a SQLite database that a running
``troth serve`` keeps writing (docs/operations.md, "Backup and restore").

The server is a real child process and the backup another process's connection, so
the copy is taken exactly as an operator takes it: WAL readers and the server's
writer at the same time, nothing paused.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from helpers.serve_process import serve
from helpers.store_jobs import BIG, promise, put
from helpers.support import VERSION
from troth.cli.main import main
from troth.protocol.records import Value
from troth.store.sqlite import SqliteStore

PREFILL = 20_000
PARAM = Value({"k": "v"}, "eA==" * 64)


def call(client: httpx.Client, kind: str, data: dict[str, object]) -> int:
    env = {
        "kind": kind,
        "head": {"corrId": f"{kind}-{data['id']}", "version": VERSION},
        "data": data,
    }
    return client.post("/", json=env).status_code


def test_backup_under_write_load_holds_everything_acknowledged_before_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    created: list[tuple[float, str]] = []  # (acknowledged at, id)
    settled: list[tuple[float, str]] = []
    refused: list[tuple[str, int]] = []
    lock = threading.Lock()
    stop = threading.Event()
    db, copy = tmp_path / "t.db", tmp_path / "copy.db"
    # Some bulk first, so that the backup takes long enough for writes to land during it.
    store = SqliteStore(db)
    put(store, *(promise(f"bulk-{i}", param=PARAM) for i in range(PREFILL)))
    store.close()

    with serve(["serve", "--db", str(db)], tmp_path, tmp_path / "log") as (_, url):

        def writer(n: int) -> None:
            with httpx.Client(base_url=url, timeout=10) as c:
                i = 0
                while not stop.is_set():
                    id = f"w{n}-{i}"
                    i += 1
                    status = call(c, "promise.create", {"id": id, "timeoutAt": 10**13})
                    if status != 200:
                        refused.append((id, status))
                        continue
                    with lock:
                        created.append((time.monotonic(), id))
                    if i % 2:  # every other one settled: both states are in flight
                        status = call(c, "promise.settle", {"id": id, "state": "resolved"})
                        if status != 200:
                            refused.append((id, status))
                            continue
                        with lock:
                            settled.append((time.monotonic(), id))

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        try:
            while len(created) < 300:
                time.sleep(0.02)
            started = time.monotonic()
            with lock:
                created_before = {id for _, id in created}
                settled_before = {id for _, id in settled}
            assert main(["backup", str(copy), "--db", str(db)]) == 0
            finished = time.monotonic()
            # The server kept taking writes after the backup started.
            deadline = time.monotonic() + 10
            while not any(at > finished for at, _ in created) and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            stop.set()
            for t in threads:
                t.join(10)
        live_total = len(created)

    assert refused == []
    assert any(at > started for at, _ in created)
    out = capsys.readouterr().out
    assert "integrity ok, schema version" in out

    store = SqliteStore(copy)
    try:
        promises = {p["id"]: p for p in store.snapshot()["promises"]}
    finally:
        store.close()
    missing = created_before - promises.keys()
    assert not missing, f"{len(missing)} acknowledged promises missing, e.g. {sorted(missing)[:3]}"
    unsettled = [id for id in settled_before if promises[id]["state"] != "resolved"]
    assert unsettled == []
    # A snapshot, not the live file at the end: writes acknowledged after it are not in it.
    assert PREFILL + len(created_before) <= len(promises) < PREFILL + live_total
    printed = re.search(r"promises\s+([\d,]+)", out)
    assert printed is not None and int(printed[1].replace(",", "")) == len(promises)
    during = sum(1 for at, _ in created if started < at < finished)
    print(f"backup took {finished - started:.3f} s; {during} creates acknowledged meanwhile")


def test_the_copy_is_one_file_in_rollback_mode_and_troth_serves_it(tmp_path: Path) -> None:
    """No -wal or -shm to carry along; a server started on the copy answers from it."""
    db = tmp_path / "t.db"
    source = SqliteStore(db)
    put(source, promise("big", timeout_at=BIG), promise("p", tags={"resonate:origin": "p"}))
    try:
        assert main(["backup", str(tmp_path / "copy.db"), "--db", str(db)]) == 0
    finally:
        source.close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("copy")) == ["copy.db"]
    mode = sqlite3.connect(tmp_path / "copy.db").execute("PRAGMA journal_mode").fetchone()
    assert mode == ("delete",)
    with (
        serve(["serve", "--db", "copy.db"], tmp_path, tmp_path / "log") as (_, url),
        httpx.Client(base_url=url) as c,
    ):
        env = {
            "kind": "promise.get",
            "head": {"corrId": "g", "version": VERSION},
            "data": {"id": "big"},
        }
        body = c.post("/", json=env).json()
        assert body["head"]["status"] == 200
        assert body["data"]["promise"]["timeoutAt"] == BIG


def test_an_existing_path_is_kept_unless_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, dest = tmp_path / "t.db", tmp_path / "copy.db"
    store = SqliteStore(db)
    put(store, promise("a"))
    store.close()
    dest.write_bytes(b"an older backup")

    assert main(["backup", str(dest), "--db", str(db)]) == 1
    assert "exists; pass --force" in capsys.readouterr().err
    assert dest.read_bytes() == b"an older backup"

    assert main(["backup", str(dest), "--db", str(db), "--force"]) == 0
    conn = sqlite3.connect(dest)
    assert conn.execute("SELECT id FROM promises").fetchall() == [("a",)]
    conn.close()
    # Nothing left beside it: the partial copy was moved, not copied.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.db", "t.db"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: None, "no database file at"),
        (
            lambda p: p.write_bytes(b"not a database at all, just text" * 100),
            "not a SQLite database",
        ),
        (
            lambda p: sqlite3.connect(p).execute("CREATE TABLE other (x)").connection.commit(),
            "not a troth database",
        ),
    ],
    ids=["missing", "not-sqlite", "not-troth"],
)
def test_a_source_that_is_not_a_troth_database_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object, message: str
) -> None:
    db, dest = tmp_path / "t.db", tmp_path / "copy.db"
    make(db)  # type: ignore[operator]
    assert main(["backup", str(dest), "--db", str(db)]) == 1
    assert message in capsys.readouterr().err
    assert not dest.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name != "t.db"] == []


def test_the_installed_command_and_the_db_setting(tmp_path: Path) -> None:
    """``troth backup PATH`` reads the database from the ``db`` setting (here
    ``TROTH_DB``), as ``troth serve`` does; a failure exits 1 with the reason."""
    store = SqliteStore(tmp_path / "live.db")
    put(store, promise("a"), promise("b"))
    store.close()
    cmd = [sys.executable, "-m", "troth.cli.main", "backup", "copy.db"]
    env = {"TROTH_DB": "live.db", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "backup of live.db written to copy.db" in done.stdout
    assert re.search(r"^  promises +2$", done.stdout, re.M), done.stdout
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1
    assert again.stderr.strip() == "troth backup: copy.db exists; pass --force to replace it"
