"""The retention loop in a real server (server/operator/retention.py): workflows settled past
the horizon disappear whole, live ones stay, the archive holds what was deleted;
two PostgreSQL nodes share the work without doing it twice."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from helpers import pg
from helpers.metrics import metric
from helpers.support import RunningServer, free_port, running_server, wait_for
from troth.machine.core import handle
from troth.machine.internal import Config
from troth.protocol import requests as rq
from troth.protocol.records import Value
from troth.server.config import ConfigError, Settings
from troth.store.base import Job, Overlay
from troth.store.sqlite import SqliteStore

HOUR = 3_600_000


#: Retention's passes so far.
PASSES = "troth_retention_passes_total"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def workflow(server: RunningServer, root: str, *, children: int = 3, live: bool = False) -> None:
    """A root and its children, all settled (or the last child left pending)."""
    far = now_ms() + HOUR
    server.ok("promise.create", {"id": root, "timeoutAt": far, "param": {}, "tags": {}})
    for k in range(children):
        tags = {"resonate:origin": root, "resonate:parent": root}
        server.ok(
            "promise.create", {"id": f"{root}.{k}", "timeoutAt": far, "param": {}, "tags": tags}
        )
        if not (live and k == children - 1):
            server.ok("promise.settle", {"id": f"{root}.{k}", "state": "resolved", "value": {}})
    server.ok("promise.settle", {"id": root, "state": "resolved", "value": {}})


def exists(server: RunningServer, id: str) -> bool:
    status, _ = server.call("promise.get", {"id": id})
    assert status in (200, 404)
    return status == 200


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Settings]:
    url = pg.create_database("troth_retention") if request.param == "postgres" else None
    try:
        yield Settings(
            store=request.param,
            db=str(tmp_path / "troth.db"),
            postgres_url=url or "",
            access_log=False,
            retention="300ms",
            retention_interval=0.1,
            retention_batch=2,
        )
    finally:
        if url is not None:
            pg.drop_database(url)


def test_settled_workflows_go_whole_and_live_ones_stay(settings: Settings, tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    with running_server(replace(settings, archive_dir=str(archive))) as server:
        for k in range(5):
            workflow(server, f"done{k}")
        workflow(server, "live", live=True)
        wait_for(
            "the settled workflows to go",
            lambda: not any(exists(server, f"done{k}") for k in range(5)),
            15,
        )
        for k in range(5):
            assert not any(exists(server, f"done{k}.{c}") for c in range(3))
        seen = metric(server.url, PASSES)
        wait_for("three more passes", lambda: metric(server.url, PASSES) >= seen + 3, 15)
        assert all(exists(server, id) for id in ("live", "live.0", "live.1", "live.2"))
        metrics = server.client.get("/metrics").text
        assert "troth_retention_trees_deleted_total 5" in metrics
        assert 'troth_retention_rows_deleted_total{table="promises"} 20' in metrics
    lines = [
        json.loads(line)
        for path in sorted(archive.glob("troth-archive-*.jsonl.gz"))
        for line in gzip.decompress(path.read_bytes()).splitlines()
    ]
    assert sorted(t["root"] for t in lines) == [f"done{k}" for k in range(5)]
    first = next(t for t in lines if t["root"] == "done0")
    assert [p["id"] for p in first["promises"]] == ["done0", "done0.0", "done0.1", "done0.2"]
    assert all(p["state"] == "resolved" for p in first["promises"])


def test_a_deleted_id_can_be_created_anew(settings: Settings) -> None:
    with running_server(settings) as server:
        workflow(server, "again", children=0)
        wait_for("the workflow to go", lambda: not exists(server, "again"), 15)
        far = now_ms() + HOUR
        body = server.ok(
            "promise.create", {"id": "again", "timeoutAt": far, "param": {}, "tags": {}}
        )
        assert body["promise"]["state"] == "pending"


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="retention"):
        Settings(retention="7 days")
    with pytest.raises(ConfigError, match="archive_dir needs retention"):
        Settings(archive_dir="/tmp/x")
    assert Settings(retention="7d").retention_ms == 7 * 86_400_000
    assert Settings().retention_ms == 0


def test_two_postgres_nodes_share_the_work_without_doing_it_twice() -> None:
    with pg.throwaway_database("troth_retention2") as url:
        base = Settings(
            store="postgres",
            postgres_url=url,
            access_log=False,
            retention="300ms",
            retention_interval=0.05,
            retention_batch=3,
        )
        with (
            running_server(replace(base, node_id="a")) as a,
            running_server(replace(base, node_id="b")) as b,
        ):
            for k in range(40):
                workflow(a if k % 2 else b, f"wf{k:02d}", children=2)
            wait_for(
                "every workflow to go",
                lambda: not any(exists(a, f"wf{k:02d}") for k in range(40)),
                30,
            )
            deleted = 0.0
            for node in (a, b):
                deleted += node.app.metrics.value("troth_retention_trees_deleted_total")
            assert deleted == 40  # each tree deleted once, by one node
            assert a.ok("promise.search", {"limit": 100})["promises"] == []


def test_a_server_killed_mid_deletion_restarts_with_no_half_trees(tmp_path: Path) -> None:
    """Trees go one batch (one transaction) at a time: SIGKILL between or inside a
    batch leaves every tree whole or gone."""
    db = tmp_path / "troth.db"
    trees, children = 1500, 3
    with closing(SqliteStore(db, synchronous="normal")) as store:
        seed_trees(store, trees, children)
    port = free_port()
    argv = [
        *[sys.executable, "-m", "troth.cli.main", "serve", "--db", str(db)],
        *["--port", str(port), "--retention", "1ms", "--retention-batch", "5"],
        *["--log-level", "warning"],
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        metrics = f"http://127.0.0.1:{port}/metrics"

        def deleting() -> bool:
            try:
                text = httpx.get(metrics, timeout=1).text
            except httpx.HTTPError:
                return False
            found = re.search(r"^troth_retention_trees_deleted_total (\d+)", text, re.M)
            return found is not None and int(found[1]) >= 50

        wait_for("retention to be under way", deleting, 15)
    finally:
        proc.kill()
        proc.wait(10)
    with closing(SqliteStore(db)) as store:
        snap = store.snapshot()
    by_root: dict[str, int] = {}
    for p in snap["promises"]:
        root = p["tags"].get("resonate:origin", p["id"])
        by_root[root] = by_root.get(root, 0) + 1
    assert 0 < len(by_root) < trees  # killed part way
    assert set(by_root.values()) == {children + 1}  # every tree left is whole
    assert len(snap["tasks"]) == len(by_root)  # and keeps its root's task


def seed_trees(store: SqliteStore, trees: int, children: int) -> None:
    """Settled workflows, settled long ago (at t = 1000 ms): a targeted root with a
    task, and local children."""
    config, head, now = Config(), {"version": "2026-04-01"}, 1000
    jobs: list[Job[None]] = []
    for t in range(trees):
        root = f"wf{t:05d}"
        reqs: list[rq.Req] = [
            rq.PromiseCreate(
                id=root,
                timeout_at=10**13,
                param=Value(),
                tags={"resonate:target": "http://127.0.0.1:9/x", "resonate:origin": root},
            )
        ]
        for c in range(children):
            child = f"{root}.{c}"
            tags = {"resonate:origin": root, "resonate:parent": root}
            reqs.append(rq.PromiseCreate(id=child, timeout_at=10**13, param=Value(), tags=tags))
            reqs.append(rq.PromiseSettle(id=child, state="resolved", value=Value()))
        reqs.append(rq.PromiseSettle(id=root, state="resolved", value=Value()))

        def job(tx: Overlay, reqs: list[rq.Req] = reqs) -> None:
            for req in reqs:
                assert handle(tx, req, now, config, head).status == 200

        jobs.append(Job(job, now))
    for k in range(0, len(jobs), 200):
        assert all(o.error is None for o in store.execute(jobs[k : k + 200]))


def test_the_timer_reports_its_passes_and_lag(tmp_path: Path) -> None:
    """Beside retention's metrics, the timer's (the dashboard charts both)."""
    settings = Settings(store="sqlite", db=str(tmp_path / "t.db"), access_log=False)
    with running_server(settings) as server:
        soon = now_ms() + 200  # external: the timer settles it at its timeout
        tags = {"resonate:external": "true"}
        server.ok("promise.create", {"id": "t", "timeoutAt": soon, "param": {}, "tags": tags})

        def metric(name: str) -> float | None:
            found = re.search(rf"^{name} (\S+)", server.client.get("/metrics").text, re.M)
            return None if found is None else float(found[1])

        wait_for("a timer pass", lambda: (metric("troth_timer_passes_total") or 0) >= 1, 15)
        passes = metric("troth_timer_passes_total")
        lag = metric("troth_timer_lag_seconds")
        assert passes is not None and passes >= 1
        assert lag is not None and 0 <= lag < 5
