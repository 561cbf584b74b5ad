"""Shared fixtures: a debug server per backend, reset before each test; a throwaway
PostgreSQL database per test module."""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import pg
from helpers.support import RunningServer, running_server
from troth.server.config import Settings
from troth.server.logs import QUIET

# A run begun as a script's background job (``cmd &``) inherits SIGINT ignored, and so
# would every process a test starts, since Python leaves an ignored SIGINT ignored: a
# ``troth serve`` stopped with Ctrl-C would then exit 0, not 130.  Each test process
# (pytest's and each xdist worker's) takes the default back, so its children start as
# from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

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

#: What a test module's source names when it needs more than this process: a child
#: process, PostgreSQL, NATS, a browser, the SDKs, faked time or namespaces.  Such a
#: module is not in the fast tier (``--fast``), nor is any test on PostgreSQL.
SLOW_MARKS = (
    "subprocess",
    "serve_process",
    "troth_process",
    "sdk_env",
    "nats",
    "pg_url",
    "throwaway_database",
    "create_database",
    "pgbouncer",
    "pgcluster",
    "faketime",
    "netns",
    "browser",
    "playwright",
    "tmpfs",
    "install",
)
#: Folders whose every test drives such things.
SLOW_FOLDERS = (
    "sdk",
    "ui",
    "mcp",
    "release",
    "upgrade",
    "faults",
    "cluster",
    "messaging",
    "bench",
)
#: Modules that wait out real socket deadlines and keep-alives (seconds each).
SLOW_MODULES = ("test_direct_post.py", "test_limits.py")


#: What a module's source names when its tests change what the machine's other tests
#: share: a PostgreSQL cluster of its own on a port (``pg_createcluster``), a network
#: namespace and its veth pair, a tmpfs mount, the main cluster's xmin horizon held
#: back (``test_bench_horizon.py`` holds it, the others read it).  On several workers
#: (pytest-xdist, ``--dist loadgroup``) such modules run on one worker, one test after
#: another (group ``serial``); the rest spreads over the workers.
SERIAL_MARKS = ("pgcluster", "netns", "tmpfs")
SERIAL_MODULES = (
    "test_bench_horizon.py",
    "test_horizon_metrics.py",
    "test_postgres_dead_tuples.py",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    tiers = parser.getgroup("troth tiers")
    tiers.addoption(
        "--fast",
        action="store_true",
        help="the fast tier only: in-process tests on memory and SQLite (docs/testing.md)",
    )
    tiers.addoption(
        "--not-fast",
        action="store_true",
        help="everything the fast tier leaves out (CI runs --fast, then this)",
    )


def slow(item: pytest.Item, sources: dict[Path, bool]) -> bool:
    """Whether ``item`` is outside the fast tier."""
    if any(word in item.nodeid for word in ("postgres", "pgbouncer", "pooled")):
        return True
    path = Path(item.path)
    if path.parent.name in SLOW_FOLDERS or path.name in SLOW_MODULES or "bench" in path.name:
        return True
    if path not in sources:
        text = path.read_text()
        sources[path] = any(mark in text for mark in SLOW_MARKS)
    return sources[path]


def serial(item: pytest.Item, sources: dict[Path, bool]) -> bool:
    """Whether ``item`` runs in xdist group ``serial`` (:data:`SERIAL_MARKS`)."""
    path = Path(item.path)
    if path.name in SERIAL_MODULES:
        return True
    if path not in sources:
        sources[path] = any(mark in path.read_text() for mark in SERIAL_MARKS)
    return sources[path]


@pytest.hookimpl(tryfirst=True)  # before xdist names each item after its group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        serials: dict[Path, bool] = {}
        for item in items:
            if serial(item, serials):
                item.add_marker(pytest.mark.xdist_group("serial"))
    fast, rest = config.getoption("--fast"), config.getoption("--not-fast")
    if not fast and not rest:
        return
    sources: dict[Path, bool] = {}
    keep = [i for i in items if slow(i, sources) == bool(rest)]
    dropped = [i for i in items if slow(i, sources) != bool(rest)]
    config.hook.pytest_deselected(items=dropped)
    items[:] = keep


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
