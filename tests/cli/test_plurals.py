"""Counts in what the commands print agree with their nouns: ``1 promise``,
``2 promises`` — in ``troth tree`` against a real server (the bench's lines:
tests/bench/test_bench.py)."""

from __future__ import annotations

import pytest

from helpers.support import RunningServer
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
