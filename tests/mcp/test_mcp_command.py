"""``troth mcp`` as a command: registered beside the others, and a clear message —
not a traceback — where the optional ``mcp`` package is not installed (simulated by
hiding it: the test venv has it)."""

from __future__ import annotations

import sys

import pytest

from troth.cli.main import main


def test_listed_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["--help"])
    assert exit.value.code == 0
    assert "mcp" in capsys.readouterr().out


def test_without_the_mcp_package(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [m for m in sys.modules if m == "mcp" or m.startswith(("mcp.", "mcp_types"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mcp", None)  # `import mcp` now fails
    monkeypatch.setitem(sys.modules, "mcp_types", None)
    monkeypatch.delitem(sys.modules, "troth.cli.mcp.server", raising=False)
    with pytest.raises(SystemExit) as exit:
        main(["--help"])
    assert exit.value.code == 0
    capsys.readouterr()
    assert main(["mcp", "--server", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("troth: `troth mcp` needs the mcp package: install troth's mcp extra")
    assert "pip install -e '.[mcp]'" in err and "Traceback" not in err
