"""The published Python SDK over NATS: ``resonate-sdk`` 0.8.1 with the
``resonate-nats`` 0.8.0 connector (``NatsConnection`` as network and source), against
a real ``troth serve --nats-url`` and a real ``nats-server``.  The SDK processes know
only the NATS URL: every request reaches troth through the queue group, and every
``execute``/``unblock`` reaches them as a ``nats://`` delivery.  The workflows are
shared/sdk-examples' (child call, durable sleep, fan-out, RPC fan-out to a worker
group, top-level RPC, idempotent re-run).  Skipped without nats-server.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.nats import NatsServer
from helpers.sdk_env import (
    EXAMPLE_PY,
    SHARED_EXAMPLES,
    Procs,
    PythonSdk,
    children_of_test,
)
from helpers.troth_process import TrothProcess

pytestmark = pytest.mark.timeout(180)

EXPECTED = EXAMPLE_PY


@pytest.fixture
def sqlite_procs(tmp_path: Path) -> Iterator[Procs]:
    with children_of_test(tmp_path) as group:
        yield group


def serve_with_nats(procs: Procs, broker: NatsServer, tmp_path: Path) -> TrothProcess:
    """``troth serve`` on SQLite with ``--nats-url``, once it serves NATS requests."""
    server = TrothProcess(procs, "server")
    argv = [
        *[sys.executable, "-m", "troth.cli.main", "serve"],
        *["--host", "127.0.0.1", "--port", str(server.port)],
        *["--store", "sqlite", "--db", str(tmp_path / "troth.db")],
        *["--retry-timeout", "1000", "--nats-url", broker.url],
    ]
    server.proc = procs.start("server", argv)
    procs.wait_for("GET /ready", server.ready, 30)
    procs.wait_for(
        "troth to serve NATS requests", lambda: "serving requests on" in server.proc.err(), 15
    )
    return server


def test_python_sdk_over_nats_runs_the_example(
    nats_sdk: PythonSdk, broker: NatsServer, sqlite_procs: Procs, tmp_path: Path
) -> None:
    procs = sqlite_procs
    server = serve_with_nats(procs, broker, tmp_path)
    assert server.proc is not None
    examples = str(SHARED_EXAMPLES)
    worker = procs.start(
        "worker", nats_sdk.program("nats_example.py", "worker", broker.url, examples)
    )
    procs.wait_line(worker, r"^worker listening", 30)
    client = procs.start(
        "client", nats_sdk.program("nats_example.py", "client", broker.url, examples)
    )
    procs.wait_exit(client, 90)
    lines = client.out().splitlines()
    assert lines[:-1] == EXPECTED, client.out() + client.err()
    assert re.fullmatch(r"elapsed \d+\.\d+s", lines[-1])
    log = server.proc.err()
    # Every request came over NATS: the access lines say so, none came over HTTP
    # but the test's own readiness probes (GET, not logged).
    access = [line for line in log.splitlines() if "troth.access" in line]
    assert access and all("via=nats" in line for line in access), "\n".join(access[:20])
    # The rpc fan-out ran on the worker: tasks were acquired by two pids.
    pids = set(re.findall(r"acquired task=\S+ version=\d+ pid=(\S+)", log))
    assert len(pids) >= 2, pids
    assert " ERROR " not in log and "Traceback" not in log, log[-3000:]


def test_http_and_nats_clients_on_one_troth_at_once(
    nats_sdk: PythonSdk,
    python_sdk: PythonSdk,
    broker: NatsServer,
    sqlite_procs: Procs,
    tmp_path: Path,
) -> None:
    """Mixed: the example over NATS and the example over HTTP/SSE, client and worker
    each, on one troth at the same time; both complete, each through its own network
    (access lines with and without ``via=nats``)."""
    procs = sqlite_procs
    server = serve_with_nats(procs, broker, tmp_path)
    assert server.proc is not None
    examples = str(SHARED_EXAMPLES)
    nats_worker = procs.start(
        "nats-worker", nats_sdk.program("nats_example.py", "worker", broker.url, examples)
    )
    http_worker = procs.start(
        "http-worker", python_sdk.program("example.py", "worker", "--url", server.url)
    )
    procs.wait_line(nats_worker, r"^worker listening", 30)
    procs.wait_line(http_worker, r"^worker listening", 30)
    nats_client = procs.start(
        "nats-client", nats_sdk.program("nats_example.py", "client", broker.url, examples)
    )
    http_client = procs.start(
        "http-client", python_sdk.program("example.py", "client", "--url", server.url)
    )
    for client in (nats_client, http_client):
        procs.wait_exit(client, 120)
        lines = client.out().splitlines()
        assert lines[:-1] == EXAMPLE_PY, client.out() + client.err()
    access = [line for line in server.proc.err().splitlines() if "troth.access" in line]
    assert any("via=nats" in line for line in access)
    assert any("via=nats" not in line for line in access)
    log = server.proc.err()
    assert " ERROR " not in log and "Traceback" not in log, log[-3000:]
