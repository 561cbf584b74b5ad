"""The browser the dashboard's tests drive: the system's Chromium (``apt-get install
chromium``), never one Playwright downloads (that fails on these machines); and a
page of it that fails its test on any console error, page error or failed request."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("TROTH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def require_chromium() -> None:
    """Skip the calling test module, saying how to get what is missing."""
    pytest.importorskip(
        "playwright.sync_api", reason="pip install -e '.[test]' brings Playwright (Python)"
    )
    if not Path(CHROMIUM).exists():
        pytest.skip(
            "no Chromium: `apt-get install -y chromium` (./scripts/test does it when it "
            "can), or set TROTH_CHROMIUM to a Chromium binary",
            allow_module_level=True,
        )


#: A folder to write the docs' screenshots to (docs/ui/), when set.
SCREENSHOTS = os.environ.get("TROTH_UI_SCREENSHOTS")


@contextmanager
def chromium() -> Iterator[Any]:
    """Headless Chromium (the system's) under Playwright, closed after the block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield b
        finally:
            b.close()


#: Text nodes of the view (decoded values in <pre> aside) that read "null" or
#: "undefined": a missing value written out instead of left out.
STRAY_TEXT = """() => {
  const out = [];
  const walk = document.createTreeWalker(document.querySelector("main"), NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    const t = n.data.trim();
    if ((t === "null" || t === "undefined") && !n.parentElement.closest("pre")) out.push(t);
  }
  return out;
}"""


class Page:
    """A page of the dashboard at ``base`` that records every console error, page
    error, failed request and HTTP error answer (:meth:`check` fails on any)."""

    def __init__(self, browser: Any, base: str, width: int = 1280) -> None:
        self.context = browser.new_context(viewport={"width": width, "height": 900})
        self.page = self.context.new_page()
        self.base = base
        self.errors: list[str] = []
        #: While the test leaves a node's dashboard for another's (:meth:`open`): the
        #: requests the old page had in flight (its /metrics poll) are aborted by that
        #: navigation, not failed by the page.
        self._leaving = False
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("requestfailed", self._failed)
        self.page.on(
            "response",
            lambda r: r.status >= 400 and self.errors.append(f"{r.status} {r.url}"),
        )

    def _failed(self, request: Any) -> None:
        if self._leaving and request.failure == "net::ERR_ABORTED":
            return
        self.errors.append(f"failed {request.url}")

    def open(self, route: str, view: str, timeout: float = 20_000) -> Any:
        """Load ``#route`` and wait until view ``view`` has drawn (``data-ready``)."""
        if not self.page.url.startswith(self.base):  # another node's dashboard, left
            self._leaving = True
            try:
                self.page.goto("about:blank")
            finally:
                self._leaving = False
        # The view before may have been of the same name (promise → promise): drop its
        # mark first, or the wait below would see the old page as the new one ready.
        self.page.evaluate("document.querySelector('main')?.removeAttribute('data-ready')")
        self.page.goto(f"{self.base}/ui/#{route}")
        self.page.wait_for_selector(f"main[data-ready={view}]", timeout=timeout)
        self.page.wait_for_load_state("networkidle")
        stray = self.page.evaluate(STRAY_TEXT)
        assert stray == [], f"{route}: text nodes reading {stray} (a value left unrendered)"
        return self.page

    def check(self) -> None:
        assert self.errors == [], self.errors

    def shot(self, name: str, selector: str | None = None) -> None:
        """The viewport (or the element ``selector`` names) as ``{name}.png``."""
        if SCREENSHOTS:
            Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
            path = str(Path(SCREENSHOTS) / f"{name}.png")
            if selector is None:
                self.page.screenshot(path=path, full_page=False)
            else:
                self.page.locator(selector).screenshot(path=path)

    def close(self) -> None:
        self.context.close()


@contextmanager
def checked_page(browser: Any, base: str, width: int = 1280) -> Iterator[Page]:
    """A :class:`Page` for one test: checked for errors when the test passed, closed."""
    p = Page(browser, base, width)
    try:
        yield p
        p.check()
    finally:
        p.close()
