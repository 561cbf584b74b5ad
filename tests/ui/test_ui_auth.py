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
from helpers.sdk_env import Procs
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
