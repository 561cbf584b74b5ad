"""``OutboxLifecycle.retry`` on every store (``troth outbox retry``'s write): a failed
row comes back pending with fresh attempts, due now — unless it is no longer failed,
a pending row of its key holds its place, or a newer execute of its task was written.
The rows are walked through their lifecycle by the stores' own calls."""

from __future__ import annotations

from typing import Any

from helpers.store_jobs import run
from troth.outbox import codes
from troth.outbox.rows import RowState
from troth.protocol.records import Execute
from troth.store.base import Store
from troth.store.outbox import settle_one


def emit(store: Store, task: str, version: int, now: int) -> None:
    run(store, lambda tx: tx.set_message("poll://any@g", Execute(task, version)), now=now)


def fail(store: Store, key: str, now: int) -> int:
    (row,) = [r for r in store.outbox.claim_due("n", now, 100, "tok") if r.key == key]
    settle_one(store.outbox, row.id, "tok", RowState.FAILED, now, codes.ATTEMPTS_EXHAUSTED)
    return row.id


def rows(store: Store, key: str) -> list[dict[str, Any]]:
    return sorted((r for r in store.snapshot()["outbox"] if r["key"] == key), key=lambda r: r["id"])


def test_retry_offers_a_failed_row_again_unless_a_newer_message_counts(store: Store) -> None:
    emit(store, "lone", 1, 1000)
    lone = fail(store, "lone", 1000)
    emit(store, "newer", 1, 1000)
    old = fail(store, "newer", 1000)
    emit(store, "newer", 2, 1100)
    newest = fail(store, "newer", 1100)  # both failed: only the newest may come back
    emit(store, "held", 1, 1000)
    held = fail(store, "held", 1000)
    emit(store, "held", 2, 1200)  # pending, unclaimed: it holds the key's place

    asked = [(lone, "lone", "lone"), (old, "newer", "newer"), (newest, "newer", "newer")]
    asked.append((held, "held", "held"))
    assert store.outbox.retry(asked, 5000) == [lone, newest]

    (row,) = rows(store, "lone")
    assert (row["state"], row["attempts"], row.get("lastCode")) == ("pending", 0, None)
    assert row["availableAt"] == 5000
    old_row, new_row = rows(store, "newer")
    assert (old_row["state"], new_row["state"]) == ("failed", "pending")
    assert [r["state"] for r in rows(store, "held")] == ["failed", "pending"]
    # Asked again, nothing is failed any more that may come back.
    assert store.outbox.retry(asked, 6000) == []
