"""The dashboard on workflows the real Python SDK ran, as an operator sees them.

A ``troth serve`` child process on a SQLite file; resonate-sdk 0.8.1 in its own
Python 3.12 venv (``helpers.sdk_env``) runs ``tests/sdk/stuck.py`` as separate
processes, each a worker of group ``stuck`` running one workflow:

* ``order-done`` finishes (a step that returns at once);
* ``order-stuck`` awaits an RPC to group ``nobody``, where no worker runs;
* ``order-sleep`` is in a ten-minute durable sleep;
* ``order-push``: a send-only client calls ``charge`` on an ``http://`` push URL
  that answers 404, so troth's delivery of the task fails for good;
* ``order-ask`` awaits an RPC like ``order-stuck``; the action test resolves that
  RPC's promise through the dashboard's dialog, and the SDK's workflow then
  finishes with the value typed in.

Every view is loaded by its URL in headless Chromium and must show the ids and
states with no console error or failed request.  Waits are on states (the
explanation settling, a line printed), never on a fixed delay.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from helpers.browser import Page, checked_page, chromium, require_chromium
from helpers.hook import hook_server
from helpers.sdk_env import Proc, Procs, build_python_sdk, children_of_test
from helpers.troth_process import LoggedServer

require_chromium()
playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect

pytestmark = pytest.mark.timeout(300)

WAIT = 90.0
HOUR = 3_600_000


@dataclass
class Sdk:
    """The server, the SDK processes by workflow id, and what the test needs of them."""

    procs: Procs
    server: LoggedServer
    hook: str
    runs: dict[str, Proc] = field(default_factory=dict)

    def ops(self, path: str, **params: Any) -> Any:
        r = httpx.get(f"{self.server.url}/ops/{path}", params=params, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()

    def start(self, id: str, mode: str, *extra: str) -> Proc:
        sdk = build_python_sdk()
        argv = sdk.program("stuck.py", "--url", self.server.url, "--id", id, "--mode", mode)
        proc = self.procs.start(id, [*argv, *extra])
        self.procs.wait_line(proc, rf"^started {id} pid=\d+$", WAIT)
        self.runs[id] = proc
        return proc

    def blocked_by(self, id: str, reasons: set[str]) -> dict[str, Any]:
        """The explanation of ``id`` once its blockers' reasons are ``reasons``."""
        seen: dict[str, Any] = {}

        def settled() -> bool:
            seen.update(self.ops("explain", id=id))
            return {b["reason"] for b in seen["blockers"]} == reasons

        self.procs.wait_for(f"explain {id} to give {sorted(reasons)}", settled, WAIT)
        return seen

    def child(self, root: str) -> str:
        """The one promise ``root`` awaits (its RPC or its sleep)."""
        ids = [p["id"] for p in self.ops("tree", id=root)["promises"] if p["id"] != root]
        assert len(ids) == 1, ids
        return str(ids[0])


@pytest.fixture(scope="module")
def sdk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sdk]:
    build_python_sdk()  # before any server starts: a first build takes a while
    with children_of_test(tmp_path_factory.mktemp("ui-sdk")) as procs, hook_server() as hook:
        hook.status[0] = 404  # the push target refuses every delivery
        # No re-dispatch of a pending task within the module: the refused push stays
        # one failed row (a retry would make it pending again, for a moment).
        extra = ["--retry-timeout", "600000"]
        server = LoggedServer(procs, "sqlite", procs.workdir / "troth.db", None, extra)
        server.start()
        s = Sdk(procs, server, f"http://127.0.0.1:{hook.port}/hook")
        done = s.start("order-done", "done")
        procs.wait_line(done, r"^result -> slept$", WAIT)
        s.start("order-stuck", "rpc")
        s.start("order-sleep", "sleep")
        s.start("order-ask", "rpc")
        s.start("order-push", "push", "--target", s.hook)
        s.blocked_by("order-stuck", {"no_worker"})
        s.blocked_by("order-ask", {"no_worker"})
        s.blocked_by("order-sleep", {"sleeping"})
        s.blocked_by("order-push", {"delivery_failed"})
        s.server.call(
            "schedule.create",
            {
                "id": "orders-nightly",
                "cron": "0 3 * * *",
                "promiseId": "orders.{{.timestamp}}",
                "promiseTimeout": HOUR,
            },
        )
        yield s
        assert server.problems() == []


@pytest.fixture(scope="module")
def browser(sdk: Sdk) -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any, sdk: Sdk) -> Iterator[Page]:
    with checked_page(browser, sdk.server.url) as p:
        yield p


def test_overview_counts_the_workflows_and_shows_the_failed_push_and_the_workers(
    page: Page, sdk: Sdk
) -> None:
    pg = page.open("/", "overview")
    pg.wait_for_selector("text=counted in")
    expect(pg.locator("main")).to_contain_text("order-push", timeout=20_000)
    text = pg.inner_text("main")
    assert "troth.http.status_404" in text and sdk.hook in text
    # The SDK processes still running are workers of group `stuck` on this node.
    node = sdk.ops("workers")["nodes"][0]["node"]
    assert "stuck" in text and node in text and sdk.server.url in text
    counts = sdk.ops("counts")
    assert counts["promises"]["pending"] >= 7  # 4 roots, 3 awaited, + ask's RPC
    assert counts["tasks"]["suspended"] == 3  # stuck, sleep, ask


def test_workflows_search_lists_each_state(page: Page) -> None:
    pg = page.open("/workflows?prefix=order-&state=pending", "workflows")
    pg.wait_for_selector("main table")
    ids = set(pg.locator("main table tbody td:first-child").all_inner_texts())
    assert {"order-stuck", "order-sleep", "order-push", "order-ask"} <= ids, ids
    assert "order-done" not in ids and "order-done:1" not in ids
    # A tag no index covers: the RPCs to group `nobody`, found in a bounded look.
    pg = page.open("/workflows?tags=resonate%3Atarget%3Dpoll%3A%2F%2Fany%40nobody", "workflows")
    pg.wait_for_selector("main table")
    ids = set(pg.locator("main table tbody td:first-child").all_inner_texts())
    assert ids == {"order-stuck:1", "order-ask:1"}, ids
    assert "(all there are)" in pg.inner_text("#looked")
    pg = page.open("/workflows?prefix=order-done&state=resolved", "workflows")
    pg.wait_for_selector("main table")
    rows = pg.locator("main table tbody tr")
    expect(rows.first).to_contain_text("order-done")
    assert "resolved" in pg.inner_text("main table") and "stuck" in pg.inner_text("main table")


def test_stuck_workflow_names_the_missing_group_in_explain_tree_and_timeline(
    page: Page, sdk: Sdk
) -> None:
    rpc = sdk.child("order-stuck")
    pg = page.open("/workflow/order-stuck", "workflow")
    pg.wait_for_selector(".blockers li")
    blockers = pg.inner_text(".blockers")
    assert rpc in blockers and "no_worker" in blockers
    assert "no worker connected to group `nobody`" in blockers, blockers
    assert pg.locator("a[href='#/workers?group=nobody']").count() >= 1
    tree = pg.inner_text(".call-graph")
    assert "order-stuck" in tree and rpc in tree and "suspended" in tree
    assert "stuck" in tree and "absent" in tree  # the functions, from the SDK's params
    # The timeline: the root's task events among the promise events, in order.
    timeline = pg.inner_text("#timeline table")
    lines = timeline.splitlines()
    order = [
        next(i for i, line in enumerate(lines) if "order-stuck" in line and what in line)
        for what in ("task created", "acquired at v1", "suspended at v1")
    ]
    assert order == sorted(order), timeline
    assert f"awaiting {rpc}" in timeline
    assert "execute v0 written for poll://any@nobody" in timeline  # the RPC's task
    assert "not recorded" in timeline  # the acquire's time is not kept, and it says so
    page.shot("workflow-stuck")


def test_finished_workflow_shows_done_and_its_task_fulfilled_in_the_timeline(
    page: Page,
) -> None:
    pg = page.open("/workflow/order-done", "workflow")
    pg.wait_for_selector("text=Done:")
    assert "resolved" in pg.inner_text("main")
    tree = pg.inner_text(".call-graph")
    assert "order-done:1" in tree and "run" in tree and "task fulfilled v1" in tree
    timeline = pg.inner_text("#timeline table")
    assert "task fulfilled at v1 (its promise resolved)" in timeline, timeline
    assert "promise resolved" in timeline


def test_sleeping_workflow(page: Page, sdk: Sdk) -> None:
    timer = sdk.child("order-sleep")
    pg = page.open("/workflow/order-sleep", "workflow")
    pg.wait_for_selector(".blockers li")
    blockers = pg.inner_text(".blockers")
    assert timer in blockers and "sleeping" in blockers and "durable sleep until" in blockers
    assert "sleep" in pg.inner_text(".call-graph")
    pg = page.open(f"/promise/{timer}", "promise")
    text = pg.inner_text("main")
    assert "resonate:timer" in text and "order-sleep" in text.split("Who waits for it")[1]


def test_failed_push_delivery_on_workflow_task_and_delivery_views(page: Page, sdk: Sdk) -> None:
    pg = page.open("/workflow/order-push", "workflow")
    pg.wait_for_selector(".blockers li")
    blockers = pg.inner_text(".blockers")
    assert "delivery_failed" in blockers and "404" in blockers
    timeline = pg.inner_text("#timeline table")
    assert f"execute v0 written for {sdk.hook}" in timeline
    assert "delivery failed" in timeline and "troth.http.status_404" in timeline
    pg = page.open("/task/order-push", "task")
    pg.wait_for_selector("#task table")
    history = pg.inner_text("#task")
    assert "troth.http.status_404" in history and "failed" in history and sdk.hook in history
    assert '"func": "charge"' in pg.inner_text(".param")
    pg = page.open("/delivery?state=failed", "delivery")
    text = pg.inner_text("main table")
    assert "order-push" in text and "troth.http.status_404" in text
    page.shot("delivery")


def test_promise_and_task_detail_of_a_suspended_workflow(page: Page, sdk: Sdk) -> None:
    pg = page.open("/promise/order-stuck", "promise")
    pg.wait_for_selector("#task dl")
    assert '"func": "stuck"' in pg.inner_text(".param")
    task = pg.inner_text("#task")
    assert "suspended" in task and "version\n1" in task.replace("\t", "\n")
    rpc = sdk.child("order-stuck")
    pg = page.open(f"/promise/{rpc}", "promise")
    waits = pg.inner_text("main").split("Who waits for it")[1]
    assert "order-stuck" in waits  # its callback: the awaiter
    assert '"func": "absent"' in pg.inner_text(".param")
    page.shot("promise")


def test_workers_view_shows_the_sdk_group_on_this_node(page: Page, sdk: Sdk) -> None:
    w = sdk.ops("workers")
    [group] = [g for g in w["groups"] if g["group"] == "stuck"]
    assert len(group["connections"]) >= 3  # stuck, sleep, ask still run
    node = w["nodes"][0]["node"]
    pg = page.open("/workers", "workers")
    row = pg.locator("main table tr", has_text="stuck").first
    for c in group["connections"]:
        expect(row).to_contain_text(f"{c['pid']} · {node}")
    pg = page.open("/workers?group=nobody", "workers")
    assert "No worker of group nobody has been seen" in pg.inner_text("main")


def test_schedules_view(page: Page) -> None:
    pg = page.open("/schedules", "schedules")
    text = pg.inner_text("main table")
    assert "orders-nightly" in text and "0 3 * * *" in text and "none yet" in text


def test_resolving_the_awaited_rpc_in_the_dialog_lets_the_sdk_workflow_finish(
    page: Page, sdk: Sdk
) -> None:
    rpc = sdk.child("order-ask")
    pg = page.open(f"/promise/{rpc}", "promise")
    pg.click("button[data-action=resolved]")
    pg.wait_for_selector("dialog[open]")
    pg.fill("#confirm-value", "42")
    pg.click("#confirm-ok")
    pg.wait_for_selector("text=Resolved: now resolved")
    state, value = sdk.server.promise_value(rpc)
    assert (state, value) == ("resolved", 42)
    # The SDK's worker is resumed and the workflow returns what the operator typed.
    sdk.procs.wait_line(sdk.runs["order-ask"], r"^result -> 42$", WAIT)
    pg = page.open("/workflow/order-ask", "workflow")
    expect(pg.locator("main")).to_contain_text("Done:", timeout=20_000)
    timeline = pg.inner_text("#timeline table")
    assert "v1 left acquired" in timeline and "acquired at v2" in timeline, timeline
    assert "task fulfilled at v2" in timeline
    page.shot("workflow-timeline", "#timeline")
