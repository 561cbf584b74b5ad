"""``troth bench`` is the benchmark lab, a distribution of its own (troth-bench,
bench/): the command runs it when it is installed, and without it exits 2 saying how
to install it, whatever flags it was given."""

from __future__ import annotations

import sys

import pytest

from troth.cli.main import build_parser, main


@pytest.fixture
def without_the_lab(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if troth-bench were not installed: ``import troth_bench`` finds nothing."""
    for name in [m for m in sys.modules if m == "troth_bench" or m.startswith("troth_bench.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "troth_bench", None)


def test_with_the_lab_the_command_has_its_flags() -> None:
    args = build_parser().parse_args(["bench", "--workloads", "create-settle", "--duration", "1"])
    assert args.command == "bench" and args.duration == 1


@pytest.mark.parametrize(
    "argv",
    [["bench"], ["bench", "--help"], ["bench", "--workloads", "create-settle", "--duration", "1"]],
)
def test_without_the_lab_it_exits_2_and_says_how_to_install_it(
    without_the_lab: None, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "troth-bench" in err and "pip install -e ./bench" in err


def test_without_the_lab_the_others_are_unchanged(
    without_the_lab: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "needs troth-bench" in build_parser().format_help()
    with pytest.raises(SystemExit) as exc:  # an unknown flag is still refused
        main(["serve", "--no-such-flag"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
