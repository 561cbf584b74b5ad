"""``troth limits set|get|list|delete`` against a real SQLite server: what they print
for people and with ``--json``, their exit codes, and a usage error that sends
nothing.  What a limit does is tested in tests/flow/."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.support import RunningServer, running_server
from troth.cli.main import main
from troth.server.config import Settings

FAR = 10**13


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[RunningServer]:
    with running_server(Settings(db=str(tmp_path / "cli.db"))) as s:
        yield s


def cli(
    server: RunningServer, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    code = main([*argv, "--server", server.url])
    out, err = capsys.readouterr()
    return code, out, err


def test_set_list_get_delete(
    sqlite_server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    s = sqlite_server
    assert cli(s, capsys, "limits", "list") == (0, "no limits\n", "")
    code, out, _ = cli(s, capsys, "limits", "set", "payments", "--concurrency", "1")
    assert (code, out) == (0, "payments: concurrency 1 (0 in use, 0 held)\n")
    for i in range(3):
        tags = {"resonate:target": "poll://any@payments"}
        s.ok("promise.create", {"id": f"pay{i}", "timeoutAt": FAR, "tags": tags})
    code, out, _ = cli(s, capsys, "limits", "list")
    assert (code, out) == (0, "payments: concurrency 1 (1 in use, 2 held)\n")
    code, out, _ = cli(s, capsys, "limits", "get", "payments", "--json")
    assert code == 0
    assert json.loads(out) == {"group": "payments", "concurrency": 1, "inUse": 1, "held": 2}
    code, out, _ = cli(s, capsys, "limits", "set", "payments", "--concurrency", "2")
    assert (code, out) == (
        0,
        "payments: concurrency 2 (2 in use, 1 held)\n  1 held tasks let through\n",
    )
    code, out, _ = cli(s, capsys, "limits", "delete", "payments")
    assert (code, out) == (0, "payments: no limit; 1 held tasks let through\n")
    assert cli(s, capsys, "limits", "list", "--json") == (0, "[]\n", "")


def test_refusals_and_usage(
    sqlite_server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    s = sqlite_server
    code, _, err = cli(s, capsys, "limits", "get", "nothing")
    assert code == 1 and "404" in err and "has no limit" in err
    code, _, err = cli(s, capsys, "limits", "set", "g", "--concurrency", "0")
    assert code == 1 and "400 concurrency must be between 1" in err
    code, _, err = cli(s, capsys, "limits", "set", "g")
    assert code == 2 and "needs --concurrency N, --rate R/s or --per-key N" in err
    code, _, err = cli(s, capsys, "limits", "delete")
    assert code == 2 and "needs a GROUP" in err
    assert cli(s, capsys, "limits", "list") == (0, "no limits\n", "")


def test_a_rate_limit_set_and_shown(
    sqlite_server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    s = sqlite_server
    code, out, _ = cli(s, capsys, "limits", "set", "llm", "--rate", "600/m", "--burst", "4")
    assert (code, out) == (0, "llm: rate 10/s burst 4 (0 in use, 0 held)\n")
    code, out, _ = cli(s, capsys, "limits", "set", "llm", "--rate", "2/s", "--concurrency", "3")
    assert (code, out) == (0, "llm: concurrency 3, rate 2/s burst 1 (0 in use, 0 held)\n")
    code, out, _ = cli(s, capsys, "limits", "get", "llm", "--json")
    assert json.loads(out) == {
        "group": "llm",
        "concurrency": 3,
        "rate": 2.0,
        "burst": 1,
        "inUse": 0,
        "held": 0,
    }
    # Refused before anything is sent: a rate that does not read, a burst alone.
    code, _, err = cli(s, capsys, "limits", "set", "llm", "--rate", "fast")
    assert code == 2 and "R/s, R/m or R/h" in err
    code, _, err = cli(s, capsys, "limits", "set", "llm", "--burst", "3", "--concurrency", "1")
    assert code == 2 and "--burst goes with --rate" in err
    code, out, _ = cli(s, capsys, "limits", "get", "llm")
    assert out == "llm: concurrency 3, rate 2/s burst 1 (0 in use, 0 held)\n"


def test_a_per_key_limit_set_and_shown(
    sqlite_server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    s = sqlite_server
    code, out, _ = cli(s, capsys, "limits", "set", "rep", "--concurrency", "4", "--per-key", "1")
    assert (code, out) == (0, "rep: concurrency 4, per key 1 (0 in use, 0 held)\n")
    for i in range(2):
        tags = {"resonate:target": "poll://any@rep", "troth:key": "acme"}
        s.ok("promise.create", {"id": f"r{i}", "timeoutAt": FAR, "tags": tags})
    code, out, _ = cli(s, capsys, "limits", "list")
    assert (code, out) == (0, "rep: concurrency 4, per key 1 (1 in use, 1 held)\n")
    code, _, err = cli(s, capsys, "limits", "set", "rep", "--per-key", "0")
    assert code == 1 and "per-key must be between 1" in err
