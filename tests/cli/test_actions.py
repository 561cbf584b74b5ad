"""``troth cancel`` and ``troth outbox retry`` against a real server (memory, SQLite,
PostgreSQL): what they print for people and with ``--json``, and their exit codes.
What the actions do is tested in tests/operator/test_cancel.py and
test_outbox_retry.py; here, the command in front of them."""

from __future__ import annotations

import json

import pytest

from helpers.support import RunningServer
from troth.cli.main import main

FAR = 10**13


def cli(
    server: RunningServer, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    code = main([*argv, "--server", server.url])
    out, err = capsys.readouterr()
    return code, out, err


def tree(server: RunningServer, root: str, size: int) -> None:
    for id in [root] + [f"{root}.{i}" for i in range(size - 1)]:
        tags = {"resonate:origin": root}
        server.ok("promise.create", {"id": id, "timeoutAt": FAR, "tags": tags})


def test_cancel_for_people_and_again(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    tree(server, "order-42", 3)
    tree(server, "order-43", 2)
    code, out, _ = cli(server, capsys, "cancel", "order-42", "--reason", "customer withdrew")
    assert (code, out) == (0, "order-42: 3 promises cancelled\n")
    states = {p["id"]: p["state"] for p in server.snap()["promises"]}
    assert states["order-42.1"] == "rejected_canceled"
    assert states["order-43"] == states["order-43.0"] == "pending"
    code, out, _ = cli(server, capsys, "cancel", "order-42")
    assert (code, out) == (0, "order-42: nothing pending (already done or cancelled)\n")


def test_cancel_as_json_and_refused(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    tree(server, "wf", 2)
    code, out, _ = cli(server, capsys, "cancel", "wf", "--json")
    assert code == 0
    answer = json.loads(out)
    assert (answer["id"], answer["canceled"], answer["first"]) == ("wf", 2, ["wf", "wf.0"])
    code, _, err = cli(server, capsys, "cancel", "missing")
    assert code == 1 and "404 no promise 'missing'" in err


def test_outbox_retry_usage(server: RunningServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(server, capsys, "outbox", "retry", "--dry-run", "--target", "g")
    assert (code, out) == (0, "0 failed deliveries found; 0 would be retried\n")
    code, _, err = cli(server, capsys, "outbox", "retry", "--state", "failed")
    assert code == 2 and "outbox retry takes --target" in err
    code, _, err = cli(server, capsys, "outbox", "--since", "1h")
    assert code == 2 and "go with `troth outbox retry`" in err
    code, _, err = cli(server, capsys, "outbox", "retry", "--since", "soon")
    assert code == 2 and "--since" in err
