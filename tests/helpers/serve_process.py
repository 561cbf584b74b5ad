"""``troth serve`` as a user runs it: a child process on a free port, ready when
``GET /ready`` answers 200, killed when the block ends (test_serve.py, test_backup.py;
:func:`started` also for an installed ``troth``, tests/helpers/install.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from helpers.support import free_port


@contextmanager
def started(cmd: list[str], url: str, log: Path, **popen: Any) -> Iterator[subprocess.Popen[bytes]]:
    """``cmd`` as a child process, yielded once ``GET {url}/ready`` answers 200 (within
    30 s), killed when the block ends if it still runs."""
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, **popen)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@contextmanager
def serve(args: list[str], cwd: Path, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    cmd = [sys.executable, "-m", "troth.cli.main", *args, "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with started(cmd, url, log, cwd=cwd) as proc:
        yield proc, url
