"""The store every backend-neutral store test runs on: memory, a SQLite file, and
PostgreSQL on the module's throwaway database (emptied per test).  Modules about one
backend (test_store_sqlite.py, test_store_postgres.py) define their own ``store``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import pg
from troth.store.base import Store
from troth.store.memory import MemoryStore
from troth.store.sqlite import SqliteStore


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "postgres":
        s: Store = pg.fresh_store(request.getfixturevalue("pg_url"))
    else:
        s = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "t.db")
    yield s
    s.close()
