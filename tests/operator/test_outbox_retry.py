"""``POST /ops/outbox/retry`` (server/operator/actions.py): deliveries that failed for good are
offered again with fresh attempts — unless their task is no longer pending or a
newer message of their key exists.  A real SQLite server, a real SSE worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.sse import stream
from helpers.store_jobs import outbox_rows
from helpers.support import RunningServer, running_server, wait_for
from troth.outbox import codes
from troth.server.config import Settings

pytestmark = pytest.mark.timeout(60)

FAR = 10**13
GAVE_UP = [("failed", codes.ATTEMPTS_EXHAUSTED, 1)]


def retry(node: RunningServer, body: Any) -> tuple[int, Any]:
    r = node.client.post("/ops/outbox/retry", json=body)
    return r.status_code, r.json()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[RunningServer]:
    # One send per row: a message for a group nobody serves fails at its first try.
    settings = Settings(
        store="sqlite", db=str(tmp_path / "t.db"), access_log=False, keepalive=0.2, max_attempts=1
    )
    with running_server(settings) as server:
        yield server


def failed(node: RunningServer, db: Path, *targets: tuple[str, str]) -> None:
    for id, address in targets:
        node.ok(
            "promise.create", {"id": id, "timeoutAt": FAR, "tags": {"resonate:target": address}}
        )
    wait_for("every send to fail", lambda: all(outbox_rows(db, id) == GAVE_UP for id, _ in targets))


def test_failed_deliveries_reach_a_worker_that_came_back(
    node: RunningServer, tmp_path: Path
) -> None:
    db = tmp_path / "t.db"
    failed(node, db, ("a", "poll://any@g"), ("halted", "poll://any@g"), ("h", "poll://any@h"))
    node.ok("task.halt", {"id": "halted"})  # its task wants no execute now

    status, dry = retry(node, {"target": "g", "dryRun": True})
    assert status == 200, dry
    assert (dry["matched"], dry["taskNotPending"], dry["retried"]) == (2, 1, 0)
    assert len(dry["rows"]) == 1
    assert outbox_rows(db, "a") == GAVE_UP  # a dry run changes nothing

    with stream(node, "g", "w1") as worker:
        status, done = retry(node, {"target": "g"})
        assert (status, done["retried"], done["rows"]) == (200, 1, dry["rows"])
        message = worker.next(timeout=5)
        assert message["data"]["task"]["id"] == "a"
    wait_for("a delivered", lambda: outbox_rows(db, "a") == [("completed", None, 0)])
    assert outbox_rows(db, "halted") == GAVE_UP
    assert outbox_rows(db, "h") == GAVE_UP  # another group's row: not the target's

    # A second retry finds nothing more of group g to offer.
    assert retry(node, {"target": "g"})[1]["retried"] == 0


def test_since_and_an_exact_address(node: RunningServer, tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    failed(node, db, ("x", "poll://any@k"), ("y", "poll://any@m"))
    # Failed more than a millisecond ago: --since 1ms matches nothing.
    wait_for("a moment", lambda: retry(node, {"since": 1, "dryRun": True})[1]["matched"] == 0)
    status, answer = retry(node, {"target": "poll://any@m", "since": 600_000, "dryRun": True})
    assert (status, answer["matched"]) == (200, 1)
    assert retry(node, {"dryRun": True})[1]["matched"] == 2  # no filter: every failed row


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"since": 0}, "since must be"),
        ({"since": "1h"}, "bad body"),
        ({"target": "g", "force": True}, "bad body"),
        ("retry", "bad body"),
    ],
)
def test_a_bad_retry_is_refused_and_changes_nothing(
    node: RunningServer, tmp_path: Path, body: Any, message: str
) -> None:
    db = tmp_path / "t.db"
    failed(node, db, ("z", "poll://any@q"))
    status, answer = retry(node, body)
    assert status == 400 and message in answer["error"], answer
    assert outbox_rows(db, "z") == GAVE_UP
