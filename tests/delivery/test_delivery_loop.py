"""The server's delivery loop end to end: a remote that hangs is
``Unknown``, the periodic reconciliation re-sends an ``execute`` whose task is still
pending at that version, and stops once the task moved on.
"""

from __future__ import annotations

import time

import pytest

from helpers import pg
from helpers.hook import hook_server
from helpers.support import running_server
from troth.outbox.rows import OutboxRow
from troth.server.config import Settings
from troth.server.delivery.loop import DeliveryLoop


def test_hanging_remote_is_reconciled_and_resent_until_the_task_moves_on() -> None:
    settings = Settings(store="memory", debug=True, send_timeout=0.2, access_log=False)
    with hook_server(delay=0.6) as hook, running_server(settings) as server:
        target = f"http://127.0.0.1:{hook.port}/slow"
        tags = {"resonate:target": target}
        server.ok("promise.create", {"id": "job", "timeoutAt": 10**13, "tags": tags})
        deadline = time.monotonic() + 10
        while len(hook.seen) < 2:
            assert time.monotonic() < deadline, hook.seen
            time.sleep(0.02)
        keys = {headers["idempotency-key"] for headers, _ in hook.seen}
        assert keys == {"job"}
        metrics = server.client.get("/metrics").text
        assert 'troth_dispatch_total{outcome="unknown"}' in metrics
        assert 'troth_outbox_reconciled_total{verdict="resent"}' in metrics
        # The worker acquires: the next reconciliation finds the execute done.
        server.ok("task.acquire", {"id": "job", "version": 0, "pid": "w", "ttl": 60_000})

        def rows() -> list[dict[str, object]]:
            return [r for r in server.snap()["outbox"] if r["key"] == "job"]

        deadline = time.monotonic() + 10
        while not all(r["state"] == "completed" for r in rows()):
            assert time.monotonic() < deadline, rows()
            time.sleep(0.05)
        assert rows()
        seen = len(hook.seen)
        time.sleep(1.5)  # longer than the backoff between re-sends: none comes
        assert len(hook.seen) == seen


def test_on_postgres_the_batch_that_writes_an_execute_claims_it(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim goes in the writing batch's own transaction (the engine's ``claim_in_batch``):
    the delivery is handed the claimed row with the commit, and sends it."""
    handed: list[tuple[int, list[str] | None]] = []
    real = DeliveryLoop.after_commit

    def spy(self: DeliveryLoop, messages: int, claimed: list[OutboxRow] | None = None) -> None:
        keys = None if claimed is None else [r.entry.message.task_id for r in claimed]  # type: ignore[union-attr]
        handed.append((messages, keys))
        real(self, messages, claimed)

    monkeypatch.setattr(DeliveryLoop, "after_commit", spy)
    pg.fresh_store(pg_url).close()
    # No re-emitted execute (a second claim) however long a loaded machine takes.
    settings = Settings(
        store="postgres", postgres_url=pg_url, debug=True, access_log=False, retry_timeout=600_000
    )
    with hook_server() as hook, running_server(settings) as server:
        tags = {"resonate:target": f"http://127.0.0.1:{hook.port}/w"}
        server.ok("promise.create", {"id": "job", "timeoutAt": 10**13, "tags": tags})
        deadline = time.monotonic() + 10
        while not hook.seen:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert {h["idempotency-key"] for h, _ in hook.seen} == {"job"}
        assert handed == [(1, ["job"])]
