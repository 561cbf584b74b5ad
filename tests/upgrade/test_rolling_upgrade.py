"""A rolling upgrade of two nodes on one PostgreSQL database, as docs/operations.md
("Upgrades") tells an operator to do it, with the previous release really running.

The older node is an earlier release checked out from this repository's history
(``helpers/releases.py``): the release before this one (schema 5) and an older build
(schema 2) whose rows, written after a newer node had migrated the database under
it, once lacked the ``origin`` column their tags imply — so searches by origin missed
them and retention's index of settled roots took them for roots.  Through the whole
upgrade both nodes write; afterwards every search, ``explain``, tree and retention
pass of the new node must see every row the old one wrote, before, during and after
the migration.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers import pg
from helpers.metrics import metric
from helpers.releases import Node, build, has_commit
from helpers.support import wait_for
from troth import __version__
from troth.store.sql.migrate import load_migrations

LATEST = len(load_migrations("troth.store.postgres"))
FAR = 2**53

#: (commit, its PostgreSQL schema version, what it is).  When a release is made, its
#: commit joins this list: the next release is then tested against it.
RELEASES = [
    ("928b4c1", 5, "release 0.1.0, the previous release"),
    ("1f3533e", 2, "an older build that wrote promises without origin"),
]


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each earlier release's python, built once for the module (about a second each)."""
    built: dict[str, Path] = {}
    for commit, _, _ in RELEASES:
        if has_commit(commit):
            built[commit] = build(commit, tmp_path_factory.mktemp(f"release-{commit}"))
    return built


def troth(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """This checkout's ``troth`` command."""
    return subprocess.run(
        [sys.executable, "-m", "troth.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def stored_version(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        assert row is not None
        return int(row[0])


class Writer:
    """Creates and settles children of two workflows through one node, one after the
    other, in a thread of its own until stopped; remembers every id it wrote."""

    def __init__(self, node: Node, tag: str) -> None:
        self.node = node
        self.tag = tag
        self.written: dict[str, list[str]] = {"root-a": [], "root-b": []}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"writer-{tag}")
        self.error: BaseException | None = None

    def write(self, n: int) -> None:
        for _ in range(n):
            self.one()

    def one(self) -> None:
        index = sum(len(ids) for ids in self.written.values())
        root = "root-a" if index % 2 == 0 else "root-b"
        id = f"{root}.{self.tag}.{index}"
        tags = {"resonate:origin": root}
        self.node.ok("promise.create", {"id": id, "timeoutAt": FAR, "tags": tags})
        self.node.ok("promise.settle", {"id": id, "state": "resolved"})
        self.written[root].append(id)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.one()
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        assert self.error is None, self.error


def search(node: Node, origin: str) -> set[str]:
    """Every promise tagged ``resonate:origin = origin``, page by page."""
    found: set[str] = set()
    cursor: str | None = None
    while True:
        data: dict[str, Any] = {"tags": {"resonate:origin": origin}, "limit": 100}
        if cursor:
            data["cursor"] = cursor
        answer = node.ok("promise.search", data)
        found |= {p["id"] for p in answer["promises"]}
        cursor = answer.get("cursor")
        if not cursor:
            return found


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("commit", "schema", "what"), RELEASES, ids=[c for c, _, _ in RELEASES])
def test_a_rolling_upgrade_under_a_live_older_node_loses_no_row(
    commit: str,
    schema: int,
    what: str,
    releases: dict[str, Path],
    tmp_path: Path,
    nodes: ExitStack,
) -> None:
    if commit not in releases:
        pytest.skip(
            f"this checkout lacks commit {commit} ({what}): run from a git clone with its "
            "full history (git fetch --unshallow) to run that release beside this one"
        )
    url = nodes.enter_context(pg.throwaway_database("troth_upgrade"))
    old = Node(releases[commit], "old-1", url, tmp_path)
    nodes.callback(old.stop)
    old.start()
    assert stored_version(url) == schema
    old.ok(
        "promise.create",
        {"id": "root-a", "timeoutAt": FAR, "tags": {"resonate:origin": "root-a"}},
    )
    old.ok("promise.create", {"id": "root-b", "timeoutAt": FAR})  # a root without the tag
    before = Writer(old, "before")
    before.write(10)

    # 1. The new release, started as is, refuses to migrate under the live old node:
    #    one line naming it, the documented exit status, the schema untouched.
    new = Node(sys.executable, "new-1", url, tmp_path)
    nodes.callback(new.stop)
    refused = subprocess.run(new.argv(), capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 4, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "old-1" in lines[0] and "troth migrate apply" in lines[0], lines[0]
    assert stored_version(url) == schema

    # 2. The operator looks, then migrates explicitly while the old node keeps writing.
    due = list(load_migrations("troth.store.postgres"))[schema:]
    check = troth("migrate", "check", "--store", "postgres", "--postgres-url", url)
    assert check.returncode == 1, check
    plan = troth("migrate", "plan", "--store", "postgres", "--postgres-url", url)
    assert plan.returncode == 0, plan
    for m in due:
        assert f"{m.version:03d}_{m.name}.sql" in plan.stdout, plan.stdout
    assert "old-1" in plan.stdout
    assert stored_version(url) == schema  # plan changes nothing
    with Writer(old, "during") as during:
        wait_for("writes before the migration", lambda: len(during.written["root-b"]) >= 3, 30)
        applied = troth("migrate", "apply", "--store", "postgres", "--postgres-url", url)
        assert applied.returncode == 0, applied
        assert "old-1" in applied.stderr  # said that it migrated under a live node
        count = sum(map(len, during.written.values()))
        wait_for(
            "writes after the migration",
            lambda: sum(map(len, during.written.values())) > count + 10,
            30,
        )
    assert stored_version(url) == LATEST

    # 3. The new node starts on the migrated schema; both write side by side.
    new.start("--retention", "1s", "--retention-interval", "0.2")
    with Writer(old, "after-old") as after_old, Writer(new, "after-new") as after_new:
        wait_for(
            "writes through both nodes",
            lambda: min(len(after_old.written["root-b"]), len(after_new.written["root-b"])) >= 10,
            30,
        )
    writers = [before, during, after_old, after_new]
    children = {
        root: {id for w in writers for id in w.written[root]} for root in ("root-a", "root-b")
    }

    # 4. Which release and schema each node runs, as troth workers and the dashboard show.
    shown = {n["node"]: n for n in new.ops("workers")["nodes"]}
    assert shown["new-1"]["release"] == __version__ and shown["new-1"]["schema"] == LATEST
    assert shown["old-1"]["release"] is None and shown["old-1"]["schema"] is None
    workers = troth("workers", "--server", new.base)
    assert workers.returncode == 0, workers
    assert "old-1" in workers.stdout and __version__ in workers.stdout, workers.stdout

    # 5. Every row is found: no promise lacks the origin its tags carry, and searches,
    #    explain and the workflow's tree on the new node see each one.
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM promises WHERE origin IS NULL AND tags::jsonb ? 'resonate:origin'"
        ).fetchone()
    assert row is not None and row[0] == 0
    assert search(new, "root-a") == children["root-a"] | {"root-a"}
    assert search(new, "root-b") == children["root-b"]
    tree = new.ops("tree", id="root-b", limit="5000")
    assert {p["id"] for p in tree["promises"]} == children["root-b"] | {"root-b"}
    for id in sorted(children["root-b"])[:: max(1, len(children["root-b"]) // 20)]:
        facts = new.ops("explain", id=id)["root"]
        assert (facts["id"], facts["state"]) == (id, "resolved"), facts

    # 6. Retention (1 s horizon, every 0.2 s) has been running on the new node: no
    #    settled child of a pending root is taken for a root of its own and deleted.
    passes = "troth_retention_passes_total"
    seen = metric(new.base, passes)
    wait_for("three more passes of retention", lambda: metric(new.base, passes) >= seen + 3, 30)
    assert search(new, "root-b") == children["root-b"]
    assert search(new, "root-a") == children["root-a"] | {"root-a"}
    # Once its root settles, a workflow goes whole, and only that one.
    new.ok("promise.settle", {"id": "root-a", "state": "resolved"})
    wait_for("root-a's workflow deleted", lambda: not search(new, "root-a"), 30)
    assert search(new, "root-b") == children["root-b"]
    status, _ = new.call("promise.get", {"id": "root-b"})
    assert status == 200
