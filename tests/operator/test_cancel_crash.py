"""A big workflow cancelled while the server is killed half way, then finished by a
second ``troth cancel`` (server/operator/cancel.py: bounded transactions, resumable).  A real
``troth serve`` on a SQLite file, SIGKILLed; the CLI as a user runs it."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.serve_process import serve
from helpers.store_jobs import promise, put
from troth.store.sqlite import SqliteStore

pytestmark = pytest.mark.timeout(180)

SIZE = 10_000
FAR = 10**13
ROOT = "big"


def seed(db: Path) -> None:
    """The tree written straight into the file (a worker would take minutes)."""
    store = SqliteStore(db)
    try:
        tags = {"resonate:origin": ROOT}
        ids = [ROOT] + [f"{ROOT}.{i:05d}" for i in range(SIZE - 1)]
        for at in range(0, SIZE, 2000):
            batch = [
                promise(id, tags=tags, timeout_at=FAR, created_at=1000 + n)
                for n, id in enumerate(ids[at : at + 2000], start=at)
            ]
            put(store, *batch)
    finally:
        store.close()


def states(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(db, timeout=10)
    try:
        rows = conn.execute("SELECT state, count(*) FROM promises GROUP BY state").fetchall()
        return {str(s): int(n) for s, n in rows}
    finally:
        conn.close()


def root_state(db: Path) -> str:
    conn = sqlite3.connect(db, timeout=10)
    try:
        row = conn.execute("SELECT state FROM promises WHERE id = ?", (ROOT,)).fetchone()
        return str(row[0])
    finally:
        conn.close()


def cancel(url: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "troth.cli.main", "cancel", ROOT, "--json", "--server", url]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_cancel_cut_short_by_a_crash_is_finished_by_a_second(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    seed(db)
    args = ["serve", "--db", str(db), "--no-access-log"]
    with serve(args, tmp_path, tmp_path / "first.log") as (server, url):
        first = cancel(url)
        deadline = time.monotonic() + 60
        while states(db).get("rejected_canceled", 0) < 1000:
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the cancel did not get going"
            time.sleep(0.005)
        server.kill()
        server.wait(10)
    code = first.wait(30)
    assert code == 3, first.communicate()  # the server went away mid-way
    done_before = states(db).get("rejected_canceled", 0)
    assert 1000 <= done_before < SIZE, done_before  # cut short, not finished
    assert root_state(db) == "rejected_canceled"  # the root went first
    # Every transaction was whole: the count is a number of whole chunks.
    assert done_before % 200 == 0, done_before

    with serve(args, tmp_path, tmp_path / "second.log") as (_, url):
        second = cancel(url)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 0, err
    assert f'"canceled": {SIZE - done_before}' in out, out
    assert states(db) == {"rejected_canceled": SIZE}
