"""One release and one schema version, the same wherever troth names its build:
``troth --version``, ``GET /health`` and the package's metadata."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from importlib.resources import files
from pathlib import Path

import httpx

from troth import PROTOCOL_VERSION, __version__
from troth.server.config import Settings
from troth.server.run import build_app
from troth.version import SCHEMA_PACKAGES, schema_version

ROOT = Path(__file__).resolve().parents[2]


def test_the_schema_version_is_the_highest_migration_of_each_sql_store() -> None:
    for package in SCHEMA_PACKAGES:
        numbers = [
            int(entry.name[:3])
            for entry in files(package).joinpath("migrations").iterdir()
            if re.match(r"\d{3}_.*\.sql$", entry.name)
        ]
        assert max(numbers) == schema_version(), package


def test_version_flag_names_release_schema_and_protocol() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "troth.cli.main", "--version"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert out.strip() == f"troth {__version__} (schema {schema_version()}, protocol 2026-04-01)"


def test_health_keeps_its_status_and_adds_the_build() -> None:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=build_app(Settings(store="memory")))
        async with httpx.AsyncClient(transport=transport, base_url="http://troth") as c:
            return await c.get("/health")

    r = asyncio.run(go())
    assert r.status_code == 200
    assert r.json() == {
        "status": "ok",
        "version": __version__,
        "schema": schema_version(),
        "protocol": PROTOCOL_VERSION,
    }


def test_the_release_is_set_once_and_the_changelog_names_it() -> None:
    """pyproject reads the version from the module (nothing to keep in step), the
    installed metadata agrees, and CHANGELOG.md has a section for this release."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "troth.__version__"}
    assert metadata.version("troth") == __version__
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(
        rf"^## \[{re.escape(__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M
    )


def test_the_install_instructions_name_the_current_wheel() -> None:
    wheel = f"troth-{__version__}-py3-none-any.whl"
    for doc in ("README.md", "docs/install.md"):
        assert wheel in (ROOT / doc).read_text(), doc


def test_the_bench_lab_is_troths_release_and_pins_it() -> None:
    """troth-bench (bench/) drives troth's internals: its release is troth's, it
    depends on exactly that troth, and the installed lab says so too."""
    bench = tomllib.loads((ROOT / "bench" / "pyproject.toml").read_text())["project"]
    assert bench["name"] == "troth-bench"
    assert bench["version"] == __version__
    assert f"troth=={__version__}" in bench["dependencies"]
    assert metadata.version("troth-bench") == __version__
