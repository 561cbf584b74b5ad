"""Fixtures of the ``troth mcp`` tests: a real ``troth serve`` process (SQLite file)
and the test's child processes (tests/helpers/mcp_session.py opens the MCP
sessions)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.sdk_env import Procs, PythonSdk, build_python_sdk, children_of_test
from helpers.troth_process import LoggedServer


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    with children_of_test(tmp_path) as group:
        yield group


@pytest.fixture
def server(procs: Procs, tmp_path: Path) -> LoggedServer:
    srv = LoggedServer(procs, "sqlite", tmp_path / "troth.db", None, ["--retry-timeout", "1000"])
    srv.start()
    return srv


@pytest.fixture(scope="module")
def python_sdk() -> PythonSdk:
    return build_python_sdk()
