"""A small real file system for the full-disk tests: a tmpfs mounted by the test.

Mounting needs root (or CAP_SYS_ADMIN); where it is not allowed the test is
skipped with a reason that says so.  The mount is undone when the block ends, even
when the test failed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

HOW = "run the tests as root (mount -t tmpfs), as CI does"


@contextmanager
def tmpfs(size: str = "4m", owner: str | None = None) -> Iterator[Path]:
    """A fresh tmpfs of ``size`` mounted on a new directory (owned by ``owner``)."""
    mount = shutil.which("mount")
    if mount is None or os.geteuid() != 0:
        pytest.skip(f"a full disk is tested on a tmpfs mount, which needs root: {HOW}")
    where = Path(tempfile.mkdtemp(prefix="troth-tmpfs-"))
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}): {HOW}")
    try:
        if owner is not None:
            shutil.chown(where, owner, owner)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)
        where.rmdir()


def fill(where: Path, leave: int) -> Path:
    """A filler file that takes every byte of ``where``'s file system but ``leave``."""
    filler = where / "filler"
    free = shutil.disk_usage(where).free
    with filler.open("wb") as out:
        out.write(b"\0" * max(free - leave, 0))
    return filler
