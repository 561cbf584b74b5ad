"""Counts in what the commands print agree with their nouns: ``1 promise``,
``2 promises`` — in ``troth tree`` against a real server, and in the bench's lines."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.support import RunningServer
from troth.bench.runner import settings_lines
from troth.cli.main import main
from troth.plural import counted

FAR = 10**13


@pytest.mark.parametrize(
    ("n", "noun", "plural", "said"),
    [
        (0, "promise", None, "0 promises"),
        (1, "promise", None, "1 promise"),
        (2, "promise", None, "2 promises"),
        (12345, "promise", None, "12,345 promises"),
        (1, "child", "children", "1 child"),
        (8, "child", "children", "8 children"),
    ],
)
def test_counted(n: int, noun: str, plural: str | None, said: str) -> None:
    assert counted(n, noun, plural) == said


def test_a_count_that_stopped_early_says_so_in_the_plural() -> None:
    assert counted(10, "execute", at_least=True) == "10+ executes"
    assert counted(1, "send", at_least=True) == "1+ sends"


def tree_summary(server: RunningServer, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["tree", "wf", "--server", server.url]) == 0
    return capsys.readouterr().out.splitlines()[-1]


def test_tree_counts_one_promise_and_two(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.ok("promise.create", {"id": "wf", "timeoutAt": FAR, "tags": {"resonate:origin": "wf"}})
    assert tree_summary(server, capsys) == "(1 promise: 1 pending)"
    child = {"resonate:origin": "wf", "resonate:parent": "wf"}
    server.ok("promise.create", {"id": "wf:1", "timeoutAt": FAR, "tags": child})
    assert tree_summary(server, capsys) == "(2 promises: 2 pending)"


class Every(dict[str, Any]):
    """Bench settings where every value is ``value`` (the lines only format them)."""

    def __init__(self, value: int) -> None:
        super().__init__()
        self.value = value

    def __missing__(self, key: str) -> Any:
        return self.value


@pytest.mark.parametrize(
    ("value", "machine", "load"),
    [
        (1, "  machine:  1 CPU (1)", "  load:     1 client, 1 SSE worker;"),
        (2, "  machine:  2 CPUs (2)", "  load:     2 clients, 2 SSE workers;"),
    ],
)
def test_the_bench_says_one_client_and_one_cpu(value: int, machine: str, load: str) -> None:
    lines = settings_lines(Every(value))
    assert any(line.startswith(machine) for line in lines), lines
    assert any(line.startswith(load) for line in lines), lines
