"""The dashboard with auth on: the page (no data in it) loads without a token and
asks for one; every data request it makes is checked by the server, so only an
admin token shows anything.  Real ``troth serve`` on SQLite, real Ed25519 key,
the system's Chromium."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.browser import CHROMIUM, require_chromium
from helpers.hook import hook_server
from helpers.sdk_env import Procs
from helpers.support import VERSION, wait_for
from helpers.troth_process import LoggedServer
from troth.cli.token import keygen, sign

require_chromium()
playwright_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LoggedServer, Path]]:
    tmp = tmp_path_factory.mktemp("ui-auth")
    private, public = keygen(tmp / "keys", "ed25519")
    procs = Procs(tmp)
    try:
        server = LoggedServer(
            procs, "sqlite", tmp / "troth.db", None, ["--auth-publickey", str(public)]
        )
        server.start()
        yield server, private
    finally:
        procs.close()


def token(private: Path, **claims: Any) -> str:
    return sign({"exp": int(time.time()) + 86_400, **claims}, str(private))


def test_the_page_is_open_its_data_is_not(secured: tuple[LoggedServer, Path]) -> None:
    server, private = secured
    assert httpx.get(server.url + "/ui/", timeout=5).status_code == 200
    assert httpx.get(server.url + "/ui/app.js", timeout=5).status_code == 200
    assert httpx.get(server.url + "/ops/counts", timeout=5).status_code == 401
    tenant = {"authorization": f"Bearer {token(private, prefix='')}"}
    assert httpx.get(server.url + "/ops/counts", headers=tenant, timeout=5).status_code == 403
    assert httpx.get(server.url + "/metrics", headers=tenant, timeout=5).status_code == 403


def test_login_with_an_admin_token_and_refusal_of_a_tenant_token(
    secured: tuple[LoggedServer, Path],
) -> None:
    server, private = secured
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(server.url + "/ui/#/workers")
            page.wait_for_selector("text=Sign in")
            page.fill("input[name=token]", token(private, prefix=""))  # valid, not admin
            page.press("input[name=token]", "Enter")
            page.wait_for_selector("text=That token was refused")
            page.fill("input[name=token]", token(private, role="admin"))
            page.press("input[name=token]", "Enter")
            page.wait_for_selector("main[data-ready=workers]")
            assert "Nodes" in page.inner_text("main")
            stored = page.evaluate("() => sessionStorage.getItem('troth.token')")
            assert stored and stored.count(".") == 2  # kept for this tab only
            assert page.context.cookies() == []  # never a cookie: no CSRF on POST /
            page.click("#signout")
            page.wait_for_selector("text=Sign in")
            assert errors == []
        finally:
            browser.close()


def as_admin(server: LoggedServer, private: Path, kind: str, data: Any) -> Any:
    """One protocol request with an admin token; its answer's data."""
    envelope = {"kind": kind, "head": {"corrId": f"test-{kind}", "version": VERSION}, "data": data}
    headers = {"authorization": f"Bearer {token(private, role='admin')}"}
    body = httpx.post(server.url + "/", json=envelope, headers=headers, timeout=10).json()
    assert body["head"]["status"] == 200, body
    return body["data"]


def test_operator_actions_with_a_token_that_is_not_an_admin_are_refused_on_the_page(
    secured: tuple[LoggedServer, Path],
) -> None:
    """The page reads nothing without an admin token, so a tab meets a refused action
    when its token changed after the view was drawn: here a tenant's token is put in
    the tab's storage.  The refusal is said where the button is, and nothing changes."""
    server, private = secured
    admin = token(private, role="admin")
    tenant = token(private, prefix="")
    read = {"authorization": f"Bearer {admin}"}
    far = int(time.time() * 1000) + 3_600_000
    root = {"resonate:origin": "wf-guarded"}
    child = {"resonate:origin": "wf-guarded", "resonate:parent": "wf-guarded"}
    for id, tags in (("wf-guarded", root), ("wf-guarded.a", child)):
        as_admin(server, private, "promise.create", {"id": id, "timeoutAt": far, "tags": tags})
    with hook_server() as hook:
        # A listener's unblock that fails for good (404), to a target then mended: a
        # retry would deliver it.
        hook.status[0] = 404
        external = {"resonate:external": "true"}
        as_admin(server, private, "promise.create", {"id": "n", "timeoutAt": far, "tags": external})
        address = f"http://127.0.0.1:{hook.port}/"
        as_admin(server, private, "promise.register_listener", {"awaited": "n", "address": address})
        as_admin(server, private, "promise.settle", {"id": "n", "state": "resolved"})

        def failed() -> list[int]:
            url = server.url + "/ops/outbox?state=failed"
            rows = httpx.get(url, headers=read, timeout=10).json()["rows"]
            return [r["id"] for r in rows if r.get("promiseId") == "n"]

        wait_for("the unblock to fail", failed, timeout=15)
        hook.status[0] = 200

        with playwright_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = browser.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(server.url + "/ui/#/workflow/wf-guarded")
                page.wait_for_selector("text=Sign in")
                page.fill("input[name=token]", admin)
                page.press("input[name=token]", "Enter")
                page.wait_for_selector("main[data-ready=workflow]")
                swap = "t => sessionStorage.setItem('troth.token', t)"
                page.evaluate(swap, tenant)
                page.click("button[data-action=cancel-workflow]")
                page.click("#confirm-ok")
                refused = page.locator("#action-result.error")
                refused.wait_for()
                text = refused.inner_text()
                assert "Refused (HTTP 403)" in text and "needs an admin token" in text, text
                assert "sign in with one" in text
                assert page.locator("main[data-ready=workflow]").count() == 1  # still there

                page.evaluate(swap, admin)
                page.evaluate("document.querySelector('main').removeAttribute('data-ready')")
                page.goto(server.url + "/ui/#/delivery?state=failed")
                page.wait_for_selector("main[data-ready=delivery]")
                page.evaluate(swap, tenant)
                page.click("button[data-action=retry-failed]")
                refused.wait_for()
                text = refused.inner_text()
                assert "Refused (HTTP 403)" in text and "needs an admin token" in text, text
                assert page.locator("dialog[open]").count() == 0  # refused at its dry run
                assert errors == []
            finally:
                browser.close()

        for id in ("wf-guarded", "wf-guarded.a"):
            promise = as_admin(server, private, "promise.get", {"id": id})["promise"]
            assert promise["state"] == "pending", promise
        time.sleep(0.5)  # a retry, had there been one, would have sent by now
        assert len(failed()) == 1 and len(hook.seen) == 1
