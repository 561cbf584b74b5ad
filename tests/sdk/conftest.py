"""Fixtures the SDK tests share: the SDKs' environments (built once per module), the
store each test runs on, its own PostgreSQL database, and its child processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.nats import NatsServer, nats_server
from helpers.pg import throwaway_database
from helpers.sdk_env import (
    NATS_CONNECTOR,
    NodeSdk,
    Procs,
    PythonSdk,
    build_node_sdk,
    build_python_sdk,
    children_of_test,
)


@pytest.fixture(scope="module")
def python_sdk() -> PythonSdk:
    return build_python_sdk()


@pytest.fixture(scope="module")
def node_sdk() -> NodeSdk:
    return build_node_sdk()


@pytest.fixture(scope="module")
def broker() -> Iterator[NatsServer]:
    """A NATS server of the module's own (the NATS SDK tests)."""
    with nats_server() as server:
        yield server


@pytest.fixture(scope="module")
def nats_sdk(broker: NatsServer) -> PythonSdk:
    """The Python SDK with its NATS connector (resonate-nats)."""
    return build_python_sdk(NATS_CONNECTOR)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def postgres_url(store: str) -> Iterator[str | None]:
    """A database of this test's own for the postgres backend (dropped after)."""
    if store != "postgres":
        yield None
        return
    with throwaway_database("troth_sdk") as url:
        yield url


@pytest.fixture
def procs(postgres_url: str | None, tmp_path: Path) -> Iterator[Procs]:
    """Children of one test, killed at teardown (before the database is dropped);
    their logs are printed then, which pytest shows only for a failed test."""
    with children_of_test(tmp_path) as group:
        yield group
