"""troth as a user installs it, away from this checkout (tests/release/): the wheel
built from a copy of the tree, installed into a venv of its own, run as a process.

The copy holds the files git knows of (tracked, and new ones it does not ignore) as
they are in the working tree, so an uncommitted change is tested too, while
anything that only happens to lie in the checkout (``.venv``, caches, build output)
cannot make the wheel work by accident."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from helpers.support import VERSION

ROOT = Path(__file__).resolve().parents[2]

#: What a wheel is built from; the Containerfile's build stage copies the same.
BUILD_INPUTS = ("pyproject.toml", "README.md", "src")


def run(cmd: list[str], timeout: float, **kwargs: Any) -> str:
    """Run ``cmd``; its stdout, or a failure that shows what it printed."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def copy_tree(dest: Path) -> None:
    listing = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = run([*listing, "--", *BUILD_INPUTS], timeout=30, cwd=ROOT)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def build_wheel(workdir: Path) -> Path:
    """``pip wheel`` on a copy of the tree in ``workdir``; the wheel's path."""
    tree = workdir / "tree"
    copy_tree(tree)
    dist = workdir / "dist"
    run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(tree)],
        timeout=300,
    )
    [wheel] = dist.glob("troth-*.whl")
    return wheel


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what points at the checkout or its venv,
    and without troth settings a developer may have exported."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TROTH_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env.update(extra)
    return env


def call(url: str, kind: str, data: dict[str, Any]) -> httpx.Response:
    env = {"kind": kind, "head": {"corrId": kind, "version": VERSION}, "data": data}
    return httpx.post(f"{url}/", json=env, timeout=5)
