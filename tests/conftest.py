"""Shared fixtures: a debug server per backend, reset before each test; a throwaway
PostgreSQL database per test module."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import pg
from helpers.support import RunningServer, running_server
from troth.server.config import Settings
from troth.server.logs import QUIET

#: Loggers ``troth serve`` configures (``server/logs.py``, ``server/run.py``).
CONFIGURED = ("troth", "troth.access", "uvicorn", "uvicorn.error", "uvicorn.access", *QUIET)


def _own(handler: logging.Handler) -> bool:
    """Not one of pytest's capture handlers (pytest adds and removes those itself)."""
    return not type(handler).__module__.startswith("_pytest")


@pytest.fixture(autouse=True)
def _logging_left_as_found() -> Iterator[None]:
    """A test that runs ``serve``'s logging set-up in this process (a handler on the
    root logger, levels) leaves logging as it found it: otherwise a later test's
    in-process server writes its access lines into that test's captured stderr."""
    root = logging.getLogger()
    level, handlers = root.level, [h for h in root.handlers if _own(h)]
    named = {
        name: (lg.level, list(lg.handlers), lg.propagate)
        for name in CONFIGURED
        for lg in (logging.getLogger(name),)
    }
    yield
    for h in [h for h in root.handlers if _own(h) and h not in handlers]:
        root.removeHandler(h)
    for h in handlers:
        if h not in root.handlers:
            root.addHandler(h)
    root.setLevel(level)
    for name, (lvl, hs, propagate) in named.items():
        lg = logging.getLogger(name)
        lg.setLevel(lvl)
        lg.handlers[:] = hs
        lg.propagate = propagate


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
