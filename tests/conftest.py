"""Shared fixtures: a debug server per backend, reset before each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support import RunningServer, running_server
from troth.server.config import Settings

BACKENDS = ["memory", "sqlite"]


@pytest.fixture(scope="session", params=BACKENDS)
def shared_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    db = Path(tmp_path_factory.mktemp("db")) / "troth.db"
    settings = Settings(store=request.param, db=str(db), debug=True, access_log=False)
    with running_server(settings) as server:
        yield server


@pytest.fixture
def server(shared_server: RunningServer) -> RunningServer:
    """A debug server (memory and SQLite) with an empty store and paused loops."""
    shared_server.reset()
    return shared_server
