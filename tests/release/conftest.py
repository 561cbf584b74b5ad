"""The wheel, built once per session from a copy of the tree (helpers/install.py), in
a directory others may read: the image test runs troth from it as an unprivileged
user, who cannot enter pytest's own temporary directories."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.install import ROOT, build_wheel


@pytest.fixture(scope="session")
def release_dir() -> Iterator[Path]:
    if not (ROOT / ".git").exists():
        pytest.skip("the wheel is built from the files git lists: run from a git checkout")
    path = Path(tempfile.mkdtemp(prefix="troth-release-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def wheel(release_dir: Path) -> Path:
    return build_wheel(release_dir / "build")
