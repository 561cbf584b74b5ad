"""Shared fixtures: a debug server per backend, reset before each test; a throwaway
PostgreSQL database per test module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import pg
from helpers.support import RunningServer, running_server
from troth.server.config import Settings

BACKENDS = ["memory", "sqlite", "postgres"]


@pytest.fixture(scope="session", params=BACKENDS)
def shared_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """One server per backend for the whole session; postgres on a throwaway database
    (tests/helpers/pg.py: created here, dropped at session end; unreachable is an error)."""
    db = Path(tmp_path_factory.mktemp("db")) / "troth.db"
    url = pg.create_database("troth_server") if request.param == "postgres" else None
    try:
        settings = Settings(
            store=request.param,
            db=str(db),
            postgres_url=url or "",
            debug=True,
            access_log=False,
        )
        with running_server(settings) as server:
            yield server
    finally:
        if url is not None:
            pg.drop_database(url)


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """One throwaway PostgreSQL database per test module (each test empties it, e.g. with
    ``pg.fresh_store``); dropped when the module is done."""
    with pg.throwaway_database() as url:
        yield url


@pytest.fixture
def server(shared_server: RunningServer) -> RunningServer:
    """A debug server (memory, SQLite, PostgreSQL) with an empty store and paused loops."""
    shared_server.reset()
    return shared_server
