"""The dashboard in a real browser: headless Chromium (the system's, never a download)
driven by Playwright against a real ``troth serve`` child process on SQLite.

The state is made on the wire (``POST /`` as the SDKs send it) rather than by SDK
workers, to keep the module to seconds: a finished workflow (task created, a local
step, fulfilled), one suspended on an RPC to a group no worker serves, one whose
push target answers 404 (failed for good), one in a durable sleep, pending promises
for the action tests, and a schedule; the operator actions' tests make the workflows
they cancel and the delivery they retry.  Every view is loaded by its URL; each must
show its ids and states with no console error or failed request.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from helpers.browser import Page, checked_page, chromium, require_chromium
from helpers.hook import hook_server
from helpers.sdk_env import Procs
from helpers.support import wait_for
from helpers.troth_process import LoggedServer
from troth import PROTOCOL_VERSION, __version__
from troth.version import schema_version

require_chromium()
playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect

HOUR = 3_600_000


def b64(value: Any) -> str:
    return base64.b64encode(json.dumps(value).encode()).decode()


def act(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "head": {}, "data": data}


class World:
    """The server, and the ids of what was made on it."""

    def __init__(self, server: LoggedServer, hook: str) -> None:
        self.server = server
        self.hook = hook

    def ok(self, kind: str, data: Any) -> Any:
        status, body = self.server.call(kind, data)
        assert status == 200, (kind, data, status, body)
        return body

    def workflow(self, root: str, func: str, group: str) -> int:
        """A root promise with a task, acquired: returns the task's version."""
        now = int(time.time() * 1000)
        tags = {"resonate:origin": root, "resonate:target": f"poll://any@{group}"}
        inner = {"id": root, "timeoutAt": now + HOUR, "param": {"data": b64({"func": func})}}
        body = self.ok(
            "task.create",
            {"pid": "w1", "ttl": 600_000, "action": act("promise.create", {**inner, "tags": tags})},
        )
        return int(body["task"]["version"])

    def child(self, root: str, id: str, **tags: str) -> None:
        now = int(time.time() * 1000)
        lineage = {"resonate:origin": root, "resonate:parent": root, **tags}
        param = {"data": b64({"func": id.split(".")[-1]})}
        self.ok(
            "promise.create", {"id": id, "timeoutAt": now + HOUR, "param": param, "tags": lineage}
        )

    def suspend(self, root: str, version: int, awaited: str) -> None:
        cb = act("promise.register_callback", {"awaited": awaited, "awaiter": root})
        self.ok("task.suspend", {"id": root, "version": version, "actions": [cb]})

    def build(self) -> None:
        now = int(time.time() * 1000)
        # Finished: a workflow with one local step, fulfilled.
        v = self.workflow("wf-done", "greet", "done-workers")
        self.child("wf-done", "wf-done.step", **{"resonate:scope": "local"})
        self.ok(
            "promise.settle", {"id": "wf-done.step", "state": "resolved", "value": {"data": b64(1)}}
        )
        settle = {
            "id": "wf-done",
            "state": "resolved",
            "value": {"data": b64({"greeting": "hello"})},
        }
        self.ok(
            "task.fulfill", {"id": "wf-done", "version": v, "action": act("promise.settle", settle)}
        )
        # Stuck: an RPC to a group with no worker.
        v = self.workflow("wf-stuck", "order", "order-workers")
        self.child("wf-stuck", "wf-stuck.charge", **{"resonate:target": "poll://any@payments"})
        self.suspend("wf-stuck", v, "wf-stuck.charge")
        # Sleeping: a durable sleep an hour long.
        v = self.workflow("wf-sleep", "remind", "order-workers")
        self.child("wf-sleep", "wf-sleep.nap", **{"resonate:timer": "true"})
        self.suspend("wf-sleep", v, "wf-sleep.nap")
        # Failed delivery: an HTTP target that answers 404.
        tags = {"resonate:origin": "wf-fail", "resonate:target": self.hook}
        self.ok("promise.create", {"id": "wf-fail", "timeoutAt": now + HOUR, "tags": tags})
        # For the actions: a human's answer, and a schedule.
        self.ok("promise.create", {"id": "approval-7", "timeoutAt": now + HOUR, "tags": {}})
        self.ok("promise.create", {"id": "approval-8", "timeoutAt": now + HOUR, "tags": {}})
        self.ok(
            "schedule.create",
            {
                "id": "nightly",
                "cron": "0 3 * * *",
                "promiseId": "report.{{.timestamp}}",
                "promiseTimeout": HOUR,
            },
        )
        self.ok(
            "schedule.create",
            {
                "id": "hourly",
                "cron": "0 * * * *",
                "promiseId": "tick.{{.timestamp}}",
                "promiseTimeout": HOUR,
            },
        )
        deadline = time.monotonic() + 15
        while True:  # the 404 comes back from the delivery loop
            rows = httpx.get(self.server.url + "/ops/outbox?state=failed", timeout=10).json()[
                "rows"
            ]
            if rows or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert [r["taskId"] for r in rows] == ["wf-fail"], rows


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("ui")
    procs = Procs(tmp)
    with hook_server() as hook:
        hook.status[0] = 404  # the push target of the failed delivery
        try:
            server = LoggedServer(
                procs, "sqlite", tmp / "troth.db", None, ["--log-level", "warning"]
            )
            server.start()
            w = World(server, f"http://127.0.0.1:{hook.port}/hook")
            w.build()
            yield w
        finally:
            procs.close()


@pytest.fixture(scope="module")
def browser(world: World) -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any, world: World) -> Iterator[Page]:
    with checked_page(browser, world.server.url) as p:
        yield p


def test_ui_is_served_with_a_strict_policy_and_the_hot_path_is_untouched(world: World) -> None:
    r = httpx.get(world.server.url + "/ui/", timeout=5)
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert (
        "<script" in r.text
        and "cdn" not in r.text.lower()
        and "http" not in r.text.split("<body>")[0]
    )
    assert httpx.get(world.server.url + "/ui", timeout=5).status_code == 308
    assert httpx.get(world.server.url + "/ui/nope.js", timeout=5).status_code == 404
    assert httpx.post(world.server.url + "/ui/", timeout=5).status_code == 405
    assert world.server.call("promise.get", {"id": "wf-done"})[0] == 200


def test_overview_shows_counts_workers_failed_deliveries_and_live_charts(
    page: Page, world: World
) -> None:
    pg = page.open("/", "overview")
    pg.wait_for_selector("text=Promises")
    body = pg.inner_text("main")
    assert "Tasks" in body and "Outbox" in body
    pg.wait_for_selector("#charts svg")
    for _ in range(4):  # traffic between the page's samples of /metrics
        for _ in range(25):
            world.server.call("promise.get", {"id": "wf-done"})
        time.sleep(1.2)
    expect(pg.locator("#charts .legend").first).to_contain_text("promise.", timeout=10_000)
    assert "Requests/s by kind" in pg.inner_text("#charts")
    label = pg.locator("#charts svg").first.get_attribute("aria-label") or ""
    rate = re.search(r"promise\.get ([0-9.]+) /s", label)
    assert rate and float(rate[1]) > 1, label  # ~20 requests/s were sent
    failed = pg.inner_text("main")
    assert "wf-fail" in failed and "troth.http.status_404" in failed
    assert "No worker group seen yet" in failed  # nobody ever connected on this node
    assert "Nodes" in failed and page.base in failed  # this node, by its URL
    expect(pg.locator("#about")).to_have_text(
        f"troth {__version__} · schema {schema_version()} · protocol {PROTOCOL_VERSION}"
    )
    page.shot("overview")


def test_workflow_search_by_prefix_state_and_tags(page: Page) -> None:
    pg = page.open("/workflows?prefix=wf-&state=pending", "workflows")
    pg.wait_for_selector("table")
    text = pg.inner_text("main table")
    for id in ("wf-stuck", "wf-sleep", "wf-fail", "wf-stuck.charge"):
        assert id in text
    assert "wf-done" not in text
    pg = page.open("/workflows?tags=resonate%3Aorigin%3Dwf-done", "workflows")
    pg.wait_for_selector("table")
    text = pg.inner_text("main table")
    assert "wf-done.step" in text and "resolved" in text and "wf-stuck" not in text
    # The form drives the URL: a search is shareable.
    pg.fill("input[name=tags]", "")
    pg.fill("input[name=prefix]", "approval-")
    pg.press("input[name=prefix]", "Enter")
    pg.wait_for_url("**prefix=approval-**")
    pg.wait_for_selector("text=approval-8")
    page.shot("workflows")


def test_stuck_workflow_explains_the_missing_worker_group_with_links(page: Page) -> None:
    pg = page.open("/workflow/wf-stuck", "workflow")
    pg.wait_for_selector(".blockers li")
    blockers = pg.inner_text(".blockers")
    assert "wf-stuck.charge" in blockers and "no_worker" in blockers and "payments" in blockers
    group = pg.locator("a[href='#/workers?group=payments']").first
    assert group.count() == 1
    tree = pg.inner_text(".call-graph")
    assert "wf-stuck" in tree and "wf-stuck.charge" in tree and "suspended" in tree
    assert "order" in tree and "charge" in tree  # the functions, decoded from the params
    group.click()
    pg.wait_for_selector("main[data-ready=workers]")
    assert "No worker of group payments has been seen" in pg.inner_text("main")


def test_sleeping_failed_and_finished_workflows(page: Page) -> None:
    pg = page.open("/workflow/wf-sleep", "workflow")
    pg.wait_for_selector(".blockers li")
    assert "sleeping" in pg.inner_text(".blockers")
    pg = page.open("/workflow/wf-fail", "workflow")
    pg.wait_for_selector(".blockers li")
    text = pg.inner_text(".blockers")
    assert "delivery_failed" in text and "404" in text
    pg = page.open("/workflow/wf-done", "workflow")
    pg.wait_for_selector("text=Done:")
    assert "wf-done.step" in pg.inner_text(".call-graph")
    assert "resolved" in pg.inner_text("main")


def test_promise_and_task_detail_decode_values_and_show_delivery_history(page: Page) -> None:
    pg = page.open("/promise/wf-done", "promise")
    pg.wait_for_selector("#task table, #task p.muted")
    value = pg.inner_text(".value")
    assert '"greeting": "hello"' in value
    assert '"func": "greet"' in pg.inner_text(".param")
    task = pg.inner_text("#task")
    assert "fulfilled" in task or "completed" in task
    pg = page.open("/promise/wf-stuck.charge", "promise")
    text = pg.inner_text("main")
    assert "wf-stuck" in text.split("Who waits for it")[1]  # its callback: the awaiter
    pg = page.open("/task/wf-fail", "task")
    pg.wait_for_selector("#task table")
    history = pg.inner_text("#task")
    assert "troth.http.status_404" in history and "failed" in history


def test_delivery_workers_and_schedules(page: Page) -> None:
    pg = page.open("/delivery?state=failed", "delivery")
    assert "wf-fail" in pg.inner_text("main table")
    pg = page.open("/workers", "workers")
    text = pg.inner_text("main")
    assert "No worker group seen yet" in text and "Nodes" in text and "yes" in text
    pg = page.open("/schedules", "schedules")
    text = pg.inner_text("main table")
    assert "nightly" in text and "0 3 * * *" in text and "report.{{.timestamp}}" in text
    assert "none yet" in text  # its latest runs (it never ran)
    page.shot("schedules")


def test_resolving_a_pending_promise_goes_through_the_protocol(page: Page, world: World) -> None:
    pg = page.open("/promise/approval-7", "promise")
    pg.click("button[data-action=resolved]")
    pg.wait_for_selector("dialog[open]")
    pg.fill("#confirm-value", '{"approved": true}')
    pg.click("#confirm-ok")
    pg.wait_for_selector("text=Resolved: now resolved")
    pg.wait_for_selector("main[data-ready=promise] .value pre")
    assert '"approved": true' in pg.inner_text(".value")
    promise = world.ok("promise.get", {"id": "approval-7"})["promise"]
    assert promise["state"] == "resolved"
    assert json.loads(base64.b64decode(promise["value"]["data"])) == {"approved": True}


def test_cancelling_the_dialog_changes_nothing_and_cancel_settles(page: Page, world: World) -> None:
    pg = page.open("/promise/approval-8", "promise")
    pg.click("button[data-action=rejected_canceled]")
    pg.wait_for_selector("dialog[open]")
    pg.keyboard.press("Escape")  # the dialog closes without acting
    pg.wait_for_selector("dialog:not([open])", state="attached")
    assert world.ok("promise.get", {"id": "approval-8"})["promise"]["state"] == "pending"
    pg.click("button[data-action=rejected_canceled]")
    pg.click("#confirm-ok")
    pg.wait_for_selector("text=now rejected_canceled")
    assert world.ok("promise.get", {"id": "approval-8"})["promise"]["state"] == "rejected_canceled"


def test_deleting_a_schedule(page: Page, world: World) -> None:
    pg = page.open("/schedules", "schedules")
    pg.click("tr:has-text('hourly') button[data-action=delete]")
    pg.click("#confirm-ok")
    pg.wait_for_selector("text=Deleted hourly")
    search = world.ok("schedule.search", {})
    assert [s["id"] for s in search["schedules"]] == ["nightly"]


def state_of(world: World, id: str) -> str:
    return str(world.ok("promise.get", {"id": id})["promise"]["state"])


def outbox(world: World, **query: str) -> list[dict[str, Any]]:
    """Outbox rows, newest first (``GET /ops/outbox``)."""
    params = {"limit": "1000", **query}
    return list(
        httpx.get(world.server.url + "/ops/outbox", params=params, timeout=10).json()["rows"]
    )


def row_state(world: World, row: int) -> str:
    return str(next(r["state"] for r in outbox(world) if r["id"] == row))


def test_cancel_workflow_settles_its_tree_and_nothing_else(page: Page, world: World) -> None:
    # A suspended root awaiting one child, a second child and a grandchild, all tagged
    # with the root as their origin; beside it, a pending promise of no workflow.
    v = world.workflow("wf-cancel", "order", "order-workers")
    world.child("wf-cancel", "wf-cancel.charge", **{"resonate:target": "poll://any@payments"})
    world.child("wf-cancel", "wf-cancel.ship")
    world.child("wf-cancel", "wf-cancel.ship.label", **{"resonate:parent": "wf-cancel.ship"})
    world.suspend("wf-cancel", v, "wf-cancel.charge")
    now = int(time.time() * 1000)
    world.ok("promise.create", {"id": "bystander", "timeoutAt": now + HOUR, "tags": {}})
    tree = ["wf-cancel", "wf-cancel.charge", "wf-cancel.ship", "wf-cancel.ship.label"]

    pg = page.open("/workflow/wf-cancel", "workflow")
    pg.click("button[data-action=cancel-workflow]")
    pg.wait_for_selector("dialog[open]")
    assert "Cancel workflow wf-cancel?" in pg.inner_text("#confirm-text")
    expect(pg.locator("#confirm-value")).to_be_hidden()  # a reason, not a value, is asked
    pg.fill("#confirm-reason", "customer withdrew")
    pg.press("#confirm-reason", "Enter")  # confirms, as the form's OK button would
    pg.wait_for_selector("#action-result:has-text('Canceled 4 promises of workflow wf-cancel')")
    pg.wait_for_selector("main[data-ready=workflow] .call-graph")
    assert "pending" not in pg.inner_text(".call-graph")  # the page was drawn again

    for id in tree:
        promise = world.ok("promise.get", {"id": id})["promise"]
        assert promise["state"] == "rejected_canceled", promise
        assert promise["value"]["headers"] == {"troth:canceled": "operator"}
        reason = json.loads(base64.b64decode(promise["value"]["data"]))
        assert reason == {"reason": "customer withdrew"}
    assert state_of(world, "bystander") == "pending"
    assert state_of(world, "wf-stuck") == "pending"  # another workflow: untouched

    # Again: idempotent, and it says nothing was pending.
    pg.click("button[data-action=cancel-workflow]")
    pg.click("#confirm-ok")
    pg.wait_for_selector("#action-result:has-text('Nothing to cancel')")


def test_dismissing_the_cancel_workflow_dialog_changes_nothing(page: Page, world: World) -> None:
    v = world.workflow("wf-keep", "order", "order-workers")
    world.child("wf-keep", "wf-keep.step", **{"resonate:timer": "true"})
    world.suspend("wf-keep", v, "wf-keep.step")
    now = int(time.time() * 1000)
    world.ok("promise.create", {"id": "approval-9", "timeoutAt": now + HOUR, "tags": {}})
    # A dialog confirmed earlier in this tab: its answer must not carry over.
    pg = page.open("/promise/approval-9", "promise")
    pg.click("button[data-action=resolved]")
    pg.click("#confirm-ok")
    pg.wait_for_selector("text=Resolved: now resolved")
    # A child's page offers no cancel of the whole; its root's page does.
    pg = page.open("/promise/wf-keep.step", "promise")
    assert pg.locator("button[data-action=cancel-workflow]").count() == 0
    pg = page.open("/promise/wf-keep", "promise")
    pg.click("button[data-action=cancel-workflow]")
    pg.wait_for_selector("dialog[open]")
    pg.fill("#confirm-reason", "not this one")
    pg.keyboard.press("Escape")
    pg.wait_for_selector("dialog:not([open])", state="attached")
    pg.click("button[data-action=cancel-workflow]")
    pg.wait_for_selector("dialog[open]")
    assert pg.input_value("#confirm-reason") == ""  # the reason typed before is gone
    pg.click("#confirm-no")  # "Back"
    pg.wait_for_selector("dialog:not([open])", state="attached")
    time.sleep(0.5)  # time for a request the page should not have sent
    assert state_of(world, "wf-keep") == "pending"
    assert state_of(world, "wf-keep.step") == "pending"
    assert pg.inner_text("#action-result") == ""


def test_retry_failed_deliveries(page: Page, world: World) -> None:
    with hook_server() as mended:
        # A listener's unblock that fails for good (404: sent once, never re-emitted,
        # unlike a pending task's execute), to a target that is then mended.
        mended.status[0] = 404
        now = int(time.time() * 1000)
        external = {"resonate:external": "true"}
        world.ok("promise.create", {"id": "note-1", "timeoutAt": now + HOUR, "tags": external})
        address = f"http://127.0.0.1:{mended.port}/hook"
        world.ok("promise.register_listener", {"awaited": "note-1", "address": address})
        world.ok("promise.settle", {"id": "note-1", "state": "resolved", "value": {}})

        def unblocks() -> list[int]:
            return [
                r["id"] for r in outbox(world, state="failed") if r.get("promiseId") == "note-1"
            ]

        wait_for("the unblock to fail", unblocks, timeout=15)
        [row] = unblocks()
        mended.status[0] = 200
        assert len(mended.seen) == 1

        pg = page.open("/delivery?state=failed", "delivery")
        assert "note-1" in pg.inner_text("main table")
        dry = httpx.post(world.server.url + "/ops/outbox/retry", json={"dryRun": True}, timeout=10)
        wanted = dry.json()["matched"] - dry.json()["taskNotPending"]
        # The unblock and wf-fail's newest execute (and wf-stuck's RPC, once its
        # attempts at a group nobody serves ran out: ~80 s in).
        assert wanted >= 2
        # Dismissed: nothing is sent.
        pg.click("button[data-action=retry-failed]")
        pg.wait_for_selector("dialog[open]")
        question = pg.inner_text("#confirm-text")
        assert f"Retry all {wanted} deliveries that failed for good" in question
        pg.keyboard.press("Escape")
        pg.wait_for_selector("dialog:not([open])", state="attached")
        time.sleep(0.5)  # time for a request the page should not have sent
        assert len(mended.seen) == 1 and row_state(world, row) == "failed"

        pg.click("button[data-action=retry-failed]")
        pg.wait_for_selector("dialog[open]")
        pg.click("#confirm-ok")
        pg.wait_for_selector("#action-result:has-text('Retried')")
        pg.wait_for_selector("main[data-ready=delivery]")
        said = pg.inner_text("#action-result")
        assert re.match(r"Retried \d+ deliver(y|ies): pending again", said), said
        wait_for("the unblock delivered", lambda: row_state(world, row) == "completed")
        assert len(mended.seen) == 2
        assert mended.seen[1][1] == mended.seen[0][1]  # the same message, sent again
    # wf-fail's target still answers 404: its execute, retried, fails again.
    wait_for("wf-fail failed again", lambda: outbox(world, task="wf-fail")[0]["state"] == "failed")


def test_narrow_screen_and_keyboard(browser: Any, world: World) -> None:
    p = Page(browser, world.server.url, width=375)
    try:
        pg = p.open("/workflow/wf-stuck", "workflow")
        pg.wait_for_selector(".blockers li")
        width = pg.evaluate("document.documentElement.scrollWidth")
        assert width <= 375, width  # nothing forces sideways scrolling of the page
        pg.keyboard.press("Tab")  # the skip link first, then the header's links
        assert pg.evaluate("document.activeElement.textContent") == "Skip to content"
        pg.keyboard.press("Tab")
        pg.keyboard.press("Tab")
        pg.keyboard.press("Tab")
        assert pg.evaluate("document.activeElement.getAttribute('href')") == "#/workflows"
        pg.keyboard.press("Enter")
        pg.wait_for_selector("main[data-ready=workflows]")
        p.shot("narrow-workflow")
        p.check()
    finally:
        p.close()


def test_workers_page_lists_the_concurrency_limits_and_follows_them(
    page: Page, world: World
) -> None:
    """Group ``ui-limited`` (limit 2) gets five tasks: two hold its slots, three are
    held (shown as waiting: every slot is in use); ``ui-idle`` has a limit and no
    work.  A task finished on the wire frees a slot, the next held task takes it, and
    the open page shows it at its next read; the held task's workflow page says where
    it stands in the queue."""
    url = world.server.url
    for group, concurrency in (("ui-limited", 2), ("ui-idle", 7)):
        r = httpx.post(
            f"{url}/ops/limits/set", json={"group": group, "concurrency": concurrency}, timeout=10
        )
        assert r.status_code == 200, r.text
    r = httpx.post(
        f"{url}/ops/limits/set",
        json={"group": "ui-rated", "rate": "2/s", "perKey": 3},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    try:
        now = int(time.time() * 1000)
        target = {"resonate:target": "poll://any@ui-limited"}
        for i in range(5):
            world.ok("promise.create", {"id": f"lim-{i}", "timeoutAt": now + HOUR, "tags": target})
        pg = page.open("/workers", "workers")

        def cells(group: str) -> dict[str, str]:
            row = pg.locator("#limits tbody tr", has_text=group)
            return {
                col: row.locator(f"[data-col={col}]").inner_text()
                for col in ("concurrency", "rate", "perKey", "inUse", "held")
            }

        assert cells("ui-limited") == {
            "concurrency": "2",
            "rate": "—",
            "perKey": "—",
            "inUse": "2",
            "held": "3",
        }
        assert cells("ui-idle") == {
            "concurrency": "7",
            "rate": "—",
            "perKey": "—",
            "inUse": "0",
            "held": "0",
        }
        assert cells("ui-rated") == {
            "concurrency": "—",
            "rate": "2/s",
            "perKey": "3",
            "inUse": "0",
            "held": "0",
        }
        held = pg.locator("#limits tbody tr", has_text="ui-limited").locator("[data-col=held]")
        assert held.get_attribute("class") == "error"  # held while every slot is in use
        page.shot("limits", "#limits")

        task = world.ok("task.get", {"id": "lim-0"})["task"]
        acquire = {"id": "lim-0", "version": task["version"], "pid": "w", "ttl": 60_000}
        version = world.ok("task.acquire", acquire)["task"]["version"]
        settle = act("promise.settle", {"id": "lim-0", "state": "resolved", "value": {}})
        world.ok("task.fulfill", {"id": "lim-0", "version": version, "action": settle})
        expect(held).to_have_text("2", timeout=10_000)  # the page reads them every 5 s
        assert cells("ui-limited")["inUse"] == "2"

        pg = page.open("/workers?group=ui-limited", "workers")
        text = pg.inner_text("#limits")
        assert "ui-limited" in text and "ui-idle" not in text

        pg = page.open("/workflow/lim-4", "workflow")
        pg.wait_for_selector(".blockers li")
        blockers = pg.inner_text(".blockers")
        assert "held_by_limit" in blockers
        assert "concurrency limit of group `ui-limited`: 2 of 2 in use, 1 task ahead" in blockers
        assert pg.locator("a[href='#/workers?group=ui-limited']").count() >= 1
    finally:
        for group in ("ui-limited", "ui-idle", "ui-rated"):
            httpx.post(f"{url}/ops/limits/delete", json={"group": group}, timeout=10)
