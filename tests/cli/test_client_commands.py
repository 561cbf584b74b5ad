"""The client commands against a real server on a socket (memory, SQLite, PostgreSQL):
what each sends, what it prints for people and with ``--json``, and its exit codes."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from helpers.support import RunningServer, free_port
from troth.cli.main import main
from troth.durations import parse_duration


def cli(
    server: RunningServer, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    code = main([*argv, "--server", server.url])
    out, err = capsys.readouterr()
    return code, out, err


def as_json(server: RunningServer, capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = cli(server, capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def b64json(data: str) -> Any:
    return json.loads(base64.b64decode(data))


def test_durations_as_people_type_them() -> None:
    assert parse_duration("1h") == 3_600_000
    assert parse_duration("1m30s") == 90_000
    assert parse_duration("100ms") == 100
    assert parse_duration("2d1s") == 172_801_000
    assert parse_duration("0") == 0
    for bad in ("", "42", "1x", "h", "1h-"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_promise_lifecycle_for_people(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(
        server, capsys, "promises", "create", "wf", "--timeout", "1h",
        "--param", '{"data": {"x": 1}}', "--tags", '{"resonate:origin": "wf"}',
    )  # fmt: skip
    assert code == 0
    lines = dict(line.split(None, 1) for line in out.splitlines() if line.strip())
    assert lines["id"].strip() == "wf"
    assert lines["state"].strip() == "pending"
    assert "(in 59m" in lines["timeout"] or "(in 1h" in lines["timeout"]
    assert lines["param"].strip() == '{"x": 1}'  # decoded from base64 JSON
    assert "tag resonate:origin  wf" in out
    # The param went out base64-encoded, as the SDKs send it.
    stored = server.ok("promise.get", {"id": "wf"})["promise"]
    assert b64json(stored["param"]["data"]) == {"x": 1}

    code, out, _ = cli(server, capsys, "promises", "resolve", "wf", "--value", '{"data": "done"}')
    assert code == 0 and "resolved" in out and "done" in out
    assert server.ok("promise.get", {"id": "wf"})["promise"]["state"] == "resolved"

    code, out, _ = cli(server, capsys, "promises", "search", "--tags", '{"resonate:origin": "wf"}')
    assert code == 0
    header, row, note = out.splitlines()
    assert header.split() == ["ID", "STATE", "CREATED", "TIMEOUT"]
    assert row.split()[:2] == ["wf", "resolved"]
    assert note == "(1 shown)"


@pytest.mark.parametrize(
    ("verb", "state"), [("reject", "rejected"), ("cancel", "rejected_canceled")]
)
def test_reject_and_cancel(
    server: RunningServer, capsys: pytest.CaptureFixture[str], verb: str, state: str
) -> None:
    as_json(server, capsys, "promises", "create", "p", "--timeout", "10m")
    got = as_json(server, capsys, "promises", verb, "p")
    assert got["promise"]["state"] == state


def test_refusals_exit_1_with_the_servers_message(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(server, capsys, "promises", "get", "nope")
    assert (code, out) == (1, "")
    assert err.strip() == "troth: promise.get refused: 404 Promise not found"
    as_json(server, capsys, "promises", "create", "p", "--timeout", "10m")
    as_json(server, capsys, "promises", "resolve", "p")
    # Settling a settled promise answers with it as it is (the specification's
    # idempotent settle): exit 0, and the state is still the first one.
    code, out, _ = cli(server, capsys, "promises", "reject", "p", "--value", '{"data": "x"}')
    assert code == 0 and dict(ln.split(None, 1) for ln in out.splitlines())["state"] == "resolved"
    code, _, err = cli(
        server, capsys, "tasks", "acquire", "p", "--pid", "w", "--version", "0", "--ttl", "5s"
    )
    assert code == 1 and "task.acquire refused: 404" in err


def test_bad_usage_exits_2_and_sends_nothing(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    before = server.snap()
    for argv in (
        ("promises", "create", "p", "--timeout", "1x"),
        ("promises", "create", "p", "--timeout", "1h", "--tags", "not json"),
        ("promises", "create", "p", "--timeout", "1h", "--tags", '{"k": 1}'),
        ("promises", "resolve", "p", "--value", "[1]"),
        ("tasks", "suspend", "p", "--version", "1", "--actions", "{}"),
        ("invoke", "f", "--id", "i", "--json-args", "{}"),
    ):
        code, out, err = cli(server, capsys, *argv)
        assert (code, out) == (2, ""), argv
        assert err.startswith("troth: "), (argv, err)
    with pytest.raises(SystemExit) as exit:  # argparse: a required flag missing
        main(["promises", "create", "p", "--server", server.url])
    assert exit.value.code == 2
    capsys.readouterr()
    assert server.snap() == before


def test_unreachable_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["promises", "get", "p", "--server", f"http://127.0.0.1:{free_port()}"])
    _, err = capsys.readouterr()
    assert code == 3 and "did not answer" in err


def test_invoke_starts_a_call_as_the_sdks_do(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    got = as_json(
        server, capsys, "invoke", "add", "--id", "call", "--arg", "1", "--arg", "two",
        "--arg", '{"k": [1]}', "--target", "poll://any@workers", "--timeout", "5m",
    )  # fmt: skip
    p = got["promise"]
    assert b64json(p["param"]["data"]) == {
        "func": "add",
        "args": [1, "two", {"k": [1]}],
        "version": 1,
    }
    assert p["tags"] == {"resonate:target": "poll://any@workers"}
    # Targeted: its task exists, pending, and an execute for the group is in the outbox.
    task = as_json(server, capsys, "tasks", "get", "call")["task"]
    assert (task["state"], task["version"]) == ("pending", 0)
    assert server.outbox()["call"]["address"] == "poll://any@workers"
    delayed = as_json(server, capsys, "invoke", "later", "--id", "c2", "--delay", "5m")["promise"]
    assert int(delayed["tags"]["resonate:delay"]) > delayed["createdAt"] + 4 * 60_000
    assert delayed["tags"]["resonate:target"] == "poll://any@default"


def test_a_task_from_create_to_fulfil(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    got = as_json(
        server, capsys, "tasks", "create", "t", "--pid", "me", "--ttl", "30s", "--timeout", "1h"
    )
    assert got["task"]["state"] == "acquired"
    version = got["task"]["version"]
    code, out, _ = cli(server, capsys, "tasks", "get", "t")
    assert code == 0 and "acquired" in out and "pid      me" in out
    beat = as_json(
        server,
        capsys,
        "tasks",
        "heartbeat",
        "--pid",
        "me",
        "--tasks",
        json.dumps([{"id": "t", "version": version}]),
    )
    assert isinstance(beat, dict)
    fence = {
        "kind": "promise.create",
        "head": {},
        "data": {"id": "t.1", "timeoutAt": 10**13, "param": {}, "tags": {}},
    }
    as_json(
        server,
        capsys,
        "tasks",
        "fence",
        "t",
        "--version",
        str(version),
        "--action",
        json.dumps(fence),
    )
    assert server.ok("promise.get", {"id": "t.1"})["promise"]["state"] == "pending"
    settle = {
        "kind": "promise.settle",
        "head": {},
        "data": {"id": "t", "state": "resolved", "value": {}},
    }
    as_json(
        server,
        capsys,
        "tasks",
        "complete",
        "t",
        "--version",
        str(version),
        "--action",
        json.dumps(settle),
    )
    assert server.ok("task.get", {"id": "t"})["task"]["state"] == "fulfilled"
    code, out, _ = cli(server, capsys, "tasks", "search", "--state", "fulfilled")
    assert code == 0 and out.splitlines()[1].split()[:2] == ["t", "fulfilled"]


def test_schedules(server: RunningServer, capsys: pytest.CaptureFixture[str]) -> None:
    got = as_json(
        server, capsys, "schedules", "create", "nightly", "--cron", "0 3 * * *",
        "--promise-id", "report.{{.timestamp}}", "--promise-timeout", "1h",
        "--promise-tags", '{"team": "ops"}',
    )  # fmt: skip
    assert got["schedule"]["promiseTimeout"] == 3_600_000
    code, out, _ = cli(server, capsys, "schedules", "get", "nightly")
    assert code == 0 and "cron             0 3 * * *" in out and "tag team" in out
    code, out, _ = cli(server, capsys, "schedules", "search", "--tags", '{"team": "ops"}')
    assert out.splitlines()[1].split()[0] == "nightly"
    assert as_json(server, capsys, "schedules", "delete", "nightly") == {}
    code, _, err = cli(server, capsys, "schedules", "get", "nightly")
    assert code == 1 and "404" in err


def test_the_installed_command_with_environment_defaults(server: RunningServer) -> None:
    """``troth`` as users run it: RESONATE_URL picks the server, exit codes reach the shell."""
    env = {**os.environ, "RESONATE_URL": server.url, "NO_COLOR": "1"}
    troth = [sys.executable, "-m", "troth.cli.main"]
    made = subprocess.run(
        [*troth, "promises", "create", "env", "--timeout", "1m"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    fields = dict(line.split(None, 1) for line in made.stdout.splitlines())
    assert fields["id"] == "env" and fields["state"] == "pending"
    assert "\x1b[" not in made.stdout  # no colour when stdout is not a terminal
    missing = subprocess.run(
        [*troth, "promises", "get", "absent"], env=env, capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 1 and "404" in missing.stderr
