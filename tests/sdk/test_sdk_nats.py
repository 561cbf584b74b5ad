"""The published Python SDK over NATS (issue 15): ``resonate-sdk`` 0.8.1 with the
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

from helpers.nats import NatsServer, nats_server
from helpers.sdk_env import NATS_CONNECTOR, SHARED_EXAMPLES, Procs, PythonSdk, build_python_sdk
from helpers.troth_process import TrothProcess

pytestmark = pytest.mark.timeout(180)

EXPECTED = [
    "workflow   -> hello world!",
    "fanout     -> [0, 1, 4, 9, 16, 25, 36, 49, 64, 81]",
    "rpc_fanout -> 285",
    "rpc        -> 49",
    "workflow (same id again) -> hello world!",
]


@pytest.fixture(scope="module")
def broker() -> Iterator[NatsServer]:
    with nats_server() as server:
        yield server


@pytest.fixture(scope="module")
def nats_sdk(broker: NatsServer) -> PythonSdk:
    return build_python_sdk(NATS_CONNECTOR)


@pytest.fixture
def sqlite_procs(tmp_path: Path) -> Iterator[Procs]:
    group = Procs(tmp_path)
    try:
        yield group
    finally:
        group.close()
        print(f"\nlogs of this test: {group.logs}\n{group.report()}")


def test_python_sdk_over_nats_runs_the_example(
    nats_sdk: PythonSdk, broker: NatsServer, sqlite_procs: Procs, tmp_path: Path
) -> None:
    procs = sqlite_procs
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
