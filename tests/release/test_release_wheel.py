"""The wheel installs alone: built from a copy of the tree, installed into a fresh venv
with nothing of the checkout on its path, ``troth serve`` serves the dashboard, builds
a fresh SQLite file's schema and keeps what it is sent."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest

from helpers.install import call, clean_env, run
from helpers.serve_process import started
from helpers.support import free_port
from troth import __version__
from troth.version import describe, health, schema_version

pytestmark = pytest.mark.timeout(600)


def test_the_wheel_holds_the_dashboard_the_migrations_and_the_release(wheel: Path) -> None:
    assert wheel.name == f"troth-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(f"troth-{__version__}.dist-info/METADATA").decode()
    assert {f"troth/ui/static/{f}" for f in ("index.html", "app.js", "app.css")} <= names
    for dialect in ("sqlite", "postgres"):
        migrations = [n for n in names if n.startswith(f"troth/store/{dialect}/migrations/")]
        assert len(migrations) == schema_version(), dialect
    assert f"\nVersion: {__version__}\n" in metadata
    # The benchmark lab is a distribution of its own (troth-bench, bench/).
    assert not [n for n in names if "bench" in n.split("/")[0] or n.startswith("troth/bench")]
    assert "Provides-Extra: bench" not in metadata


def test_installed_alone_it_serves_the_dashboard_and_a_fresh_database(
    wheel: Path, release_dir: Path, tmp_path: Path
) -> None:
    venv = release_dir / "venv"
    run([sys.executable, "-m", "venv", str(venv)], timeout=120)
    # The wheel from its file, its dependencies from the configured index.
    run([str(venv / "bin/pip"), "install", "-q", str(wheel)], timeout=480, env=clean_env())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = clean_env()
    where = run(
        [str(venv / "bin/python"), "-c", "import troth; print(troth.__file__)"],
        timeout=30,
        cwd=elsewhere,
        env=env,
    )
    assert Path(where.strip()).is_relative_to(venv)
    troth = str(venv / "bin/troth")
    assert run([troth, "--version"], timeout=30, cwd=elsewhere, env=env).strip() == describe()
    # Without the lab, `troth bench` says how to get it (and runs nothing).
    bench = subprocess.run(
        [troth, "bench"], capture_output=True, text=True, timeout=30, cwd=elsewhere, env=env
    )
    assert bench.returncode == 2 and "pip install -e ./bench" in bench.stderr, bench.stderr

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    cmd = [troth, "serve", "--db", "fresh.db", "--port", str(port)]
    with started(cmd, url, log, cwd=elsewhere, env=env) as proc:
        page = httpx.get(f"{url}/ui/", timeout=5)
        assert page.status_code == 200 and 'src="app.js"' in page.text
        assert httpx.get(f"{url}/ui/app.js", timeout=5).status_code == 200
        assert httpx.get(f"{url}/health", timeout=5).json() == health()
        created = call(url, "promise.create", {"id": "alone", "timeoutAt": 10**13})
        assert created.status_code == 200, created.text
        got = call(url, "promise.get", {"id": "alone"})
        assert got.status_code == 200 and got.json()["data"]["promise"]["id"] == "alone"
        proc.terminate()
        assert proc.wait(20) in (0, -15), log.read_text()
    text = log.read_text()
    assert f"version={__version__}, schema={schema_version()}" in text
    assert "Traceback" not in text
    with sqlite3.connect(elsewhere / "fresh.db") as db:
        assert db.execute("SELECT max(version) FROM schema_version").fetchone()[0] == (
            schema_version()
        )
        assert db.execute("SELECT state FROM promises WHERE id = 'alone'").fetchone() == (
            "pending",
        )
