"""The dashboard of two troth nodes on one PostgreSQL database: nodes with
their heartbeats on the overview; workers on the node that holds their connection.

A fresh database of the test's own (``helpers.pg``, dropped after); ``troth serve``
``n1`` and ``n2`` on it; one resonate-sdk worker (``tests/sdk/stuck.py``, group
``stuck``, a durable sleep) connected to each node.  Either node's dashboard shows
the whole cluster: both nodes alive with heartbeats that move, and each worker's pid
beside the node it is connected to.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.browser import checked_page, chromium, require_chromium
from helpers.pg import throwaway_database
from helpers.sdk_env import Procs, build_python_sdk, children_of_test
from helpers.troth_process import LoggedServer
from troth import __version__

require_chromium()
playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect

pytestmark = pytest.mark.timeout(240)

WAIT = 60.0
#: Each worker's SDK pid, by the node it connects to.
WORKERS = {"n1": "worker-on-n1", "n2": "worker-on-n2"}


def workers(node: LoggedServer) -> dict[str, Any]:
    r = httpx.get(f"{node.url}/ops/workers", timeout=10)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Procs, dict[str, LoggedServer]]]:
    sdk = build_python_sdk()
    with throwaway_database("troth_ui") as url, children_of_test(tmp_path) as procs:
        nodes = {
            name: LoggedServer(procs, "postgres", tmp_path, url, ["--node-id", name], name=name)
            for name in WORKERS
        }
        for node in nodes.values():
            node.start()
        for name, pid in WORKERS.items():
            argv = sdk.program(
                "stuck.py", "--url", nodes[name].url, "--id", f"nap-{name}", "--mode", "sleep"
            )
            procs.wait_line(procs.start(pid, [*argv, "--pid", pid]), r"^started ", WAIT)
        yield procs, nodes
        for node in nodes.values():
            assert node.problems() == [], node.name


def test_two_nodes_with_heartbeats_and_workers_on_their_nodes(
    cluster: tuple[Procs, dict[str, LoggedServer]],
) -> None:
    procs, nodes = cluster
    n1, n2 = nodes["n1"], nodes["n2"]

    def placed() -> bool:
        """Both workers' streams are published, each on the node it connected to."""
        [group] = [g for g in workers(n1)["groups"] if g["group"] == "stuck"] or [None]
        on = {c["pid"]: c["node"] for c in group["connections"]} if group else {}
        return on == {pid: node for node, pid in WORKERS.items()}

    procs.wait_for("each worker's connection on its node", placed, WAIT)
    first = {n["node"]: n["seenAt"] for n in workers(n1)["nodes"]}
    assert set(first) == {"n1", "n2"}
    procs.wait_for(
        "both nodes' heartbeats to move on",
        lambda: all(n["seenAt"] > first[n["node"]] for n in workers(n1)["nodes"]),
        WAIT,
    )
    with chromium() as browser, checked_page(browser, n1.url) as page:
        pg = page.open("/", "overview")
        nodes_table = pg.locator("section", has_text="Workers and nodes").locator("table").last
        expect(nodes_table).to_contain_text("n2", timeout=20_000)
        for node in (n1, n2):
            row = nodes_table.locator("tr", has_text=node.url)
            expect(row).to_contain_text(node.name)
            expect(row).to_contain_text("ago")  # its heartbeat, relative and absolute
            expect(row).to_contain_text(__version__)  # its release, beside its schema
            expect(row.locator("td").last).to_have_text("yes")
        page.shot("overview-cluster", 'section:has(h2:text("Workers and nodes"))')
        # The other node's dashboard shows the same cluster: the workers on their nodes.
        page.base = n2.url
        pg = page.open("/workers", "workers")
        row = pg.locator("main table tr", has_text="stuck").first
        for node, pid in WORKERS.items():
            expect(row).to_contain_text(f"{pid} · {node}")
        page.shot("workers-cluster")
