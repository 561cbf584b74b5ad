"""A worker connecting to a node of its own (SQLite, memory) gets what could not be
delivered to its stream while it was away (``OutboxStore.revive``; on PostgreSQL the
cluster does the same when a node publishes a stream: ``cluster/test_stranded.py``).

The rows are written and walked through their lifecycle by the stores' own calls,
as the dispatcher does: claimed, then backed off for want of a connection or failed
with their attempts exhausted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.store_jobs import run
from troth.outbox import codes
from troth.outbox.rows import RowState
from troth.protocol.records import Execute
from troth.store.base import Store
from troth.store.memory import MemoryStore
from troth.store.outbox import settle_one
from troth.store.sqlite import SqliteStore


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "t.db")
    try:
        yield made
    finally:
        made.close()


def emit(store: Store, address: str, task: str, version: int, now: int) -> None:
    run(store, lambda tx: tx.set_message(address, Execute(task, version)), now=now)


def attempt(store: Store, key: str, now: int, *, fail: bool) -> None:
    """The key's pending row claimed and sent to no connection: backed off a minute,
    or failed with its attempts exhausted (the only row due at ``now``)."""
    (row,) = [r for r in store.outbox.claim_due("n", now, 100, "tok") if r.key == key]
    if fail:
        settle_one(store.outbox, row.id, "tok", RowState.FAILED, now, codes.ATTEMPTS_EXHAUSTED)
    else:
        settle_one(
            store.outbox, row.id, "tok", RowState.PENDING, now, codes.NO_CONNECTION, now + 60_000
        )


def rows(store: Store, key: str) -> list[dict[str, Any]]:
    return [r for r in store.snapshot()["outbox"] if r["key"] == key]


def test_a_stream_gets_what_no_connection_could_take_and_nothing_else(store: Store) -> None:
    emit(store, "poll://uni@g/w1", "held", 1, 1000)
    attempt(store, "held", 1000, fail=False)
    emit(store, "poll://any@g/w1", "failed", 1, 1000)  # any cast, same group/id
    attempt(store, "failed", 1000, fail=True)
    emit(store, "poll://uni@g/w2", "elsewhere", 1, 1000)  # another stream
    attempt(store, "elsewhere", 1000, fail=True)
    emit(store, "poll://uni@g/w1", "long-ago", 1, 100)  # failed before the window
    attempt(store, "long-ago", 100, fail=True)
    emit(store, "poll://uni@g/w1", "twice", 1, 1000)  # two failed rows of one key
    attempt(store, "twice", 1000, fail=True)
    emit(store, "poll://uni@g/w1", "twice", 2, 1200)
    attempt(store, "twice", 1200, fail=True)
    emit(store, "poll://uni@g/w1", "newer", 1, 1000)  # failed, then a newer message
    attempt(store, "newer", 1300, fail=True)
    emit(store, "poll://uni@g/w1", "newer", 2, 1400)  # (emitted last: nothing claims it)

    # The stream's group as the worker spelled it: groups compare lower-cased.
    assert store.outbox.revive("G", "w1", 2000, 500) == (1, 2)

    (held,) = rows(store, "held")
    assert (held["state"], held["availableAt"], held["attempts"]) == ("pending", 1000, 1)
    (failed,) = rows(store, "failed")
    assert (failed["state"], failed["attempts"], failed.get("lastCode")) == ("pending", 0, None)
    assert failed["availableAt"] == failed["createdAt"] == 1000
    assert [r["state"] for r in rows(store, "twice")] == ["failed", "pending"]
    assert rows(store, "twice")[1]["message"]["version"] == 2  # the newest one
    assert [r["state"] for r in rows(store, "elsewhere")] == ["failed"]
    assert [r["state"] for r in rows(store, "long-ago")] == ["failed"]
    assert [r["state"] for r in rows(store, "newer")] == ["failed", "pending"]
    assert rows(store, "newer")[1]["message"]["version"] == 2  # untouched, due as written

    # What was offered goes out now; asking again finds nothing more.
    due = {r.key for r in store.outbox.claim_due("n", 2000, 100, "tok2")}
    assert due == {"held", "failed", "twice", "newer"}
    assert store.outbox.revive("g", "w1", 2000, 500) == (0, 0)
