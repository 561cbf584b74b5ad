"""A ``troth serve`` process whose wall clock the test moves (libfaketime).

The server runs with ``LD_PRELOAD=libfaketime.so.1`` and reads its clock's offset
from a file the test rewrites (``FAKETIME_TIMESTAMP_FILE``, read again at every
reading with ``FAKETIME_NO_CACHE=1``): writing ``+3600`` steps its wall clock an
hour forward at once, as an NTP step or a resumed VM would.  The monotonic clock is
left alone (``FAKETIME_DONT_FAKE_MONOTONIC=1``), as such a step leaves it.

libfaketime comes with the ``faketime`` package (``apt-get install faketime``,
which scripts/test does); without it the tests are skipped, saying so.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from helpers.support import free_port

LIBRARY = "libfaketime.so.1"
HOW = "install libfaketime: apt-get install faketime (scripts/test does)"


def library() -> str:
    found = sorted(
        glob.glob(f"/usr/lib/*/faketime/{LIBRARY}") + glob.glob(f"/usr/lib/faketime/{LIBRARY}")
    )
    if not found:
        pytest.skip(f"clock steps are tested under libfaketime, which is missing: {HOW}")
    return found[0]


@dataclass
class FakedServer:
    url: str
    offset_file: Path
    log: Path
    proc: subprocess.Popen[bytes]

    def step(self, seconds: int) -> None:
        """Set the server's wall clock to real time + ``seconds`` (at once)."""
        tmp = self.offset_file.with_suffix(".tmp")
        tmp.write_text(f"{seconds:+d}\n")
        tmp.replace(self.offset_file)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def faked_server(tmp: Path, args: list[str]) -> Iterator[FakedServer]:
    """``troth serve ARGS`` under libfaketime, its clock at real time to begin with."""
    lib = library()
    offset = tmp / "clock-offset"
    offset.write_text("+0\n")
    port = free_port()
    env = {
        **os.environ,
        "LD_PRELOAD": lib,
        "FAKETIME_TIMESTAMP_FILE": str(offset),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "DONT_FAKE_MONOTONIC": "1",
    }
    log = tmp / f"serve-{port}.log"
    cmd = [sys.executable, "-m", "troth.cli.main", "serve", *args, "--port", str(port)]
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    server = FakedServer(url, offset, log, proc)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, server.text()
            assert time.monotonic() < deadline, server.text()
            time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
