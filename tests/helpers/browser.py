"""The browser the dashboard's tests drive: the system's Chromium (``apt-get install
chromium``), never one Playwright downloads (that fails on these machines)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

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
