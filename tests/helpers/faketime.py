"""A ``troth serve`` process whose wall clock the test moves (libfaketime).

The server runs with ``LD_PRELOAD=libfaketimeMT.so.1`` and reads its clock's offset
from a file the test rewrites (``FAKETIME_TIMESTAMP_FILE``, read again at every
reading with ``FAKETIME_NO_CACHE=1``): writing ``+3600`` steps its wall clock an
hour forward at once, as an NTP step or a resumed VM would.  The monotonic clock is
left alone (``FAKETIME_DONT_FAKE_MONOTONIC=1``), as such a step leaves it.

The library is the serialised build (``MT``), not ``libfaketime.so.1``: that one reads
the file into static buffers with no lock, and its file name is rewritten by
``snprintf`` at every reading — glibc's ``snprintf`` clears the first byte before it
writes, so a thread that opens the file meanwhile opens ``""``, finds no file and
falls back to an offset of ``+0``.  A server's threads read the clock outside the
GIL (a thread waiting for the GIL reads it in libfaketime's own timed wait; C
libraries read it), so now and then a reading of a server an hour ahead came back at
real time: its clock watch (rightly) saw two more steps of an hour, back and forth,
most often on a loaded machine.  The ``MT``
build holds a mutex over each faked reading, so every reading is of the file as it
is.  (That mutex makes ``fork`` without ``exec`` unsafe in a threaded process under
it: these servers run without ``--workers``.)

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

#: The serialised build (see above), in the same package as ``libfaketime.so.1``.
LIBRARY = "libfaketimeMT.so.1"
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
        set_offset(self.offset_file, seconds)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def faked_env(offset: Path) -> dict[str, str]:
    """The environment of a process whose wall clock is real time + what ``offset``
    holds, read at every reading of the clock."""
    return {
        **os.environ,
        "LD_PRELOAD": library(),
        "FAKETIME_TIMESTAMP_FILE": str(offset),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "DONT_FAKE_MONOTONIC": "1",
    }


def set_offset(offset: Path, seconds: int) -> None:
    """Write ``seconds`` into ``offset`` at once (a reader sees the old or the new)."""
    tmp = offset.with_suffix(".tmp")
    tmp.write_text(f"{seconds:+d}\n")
    tmp.replace(offset)


@contextmanager
def faked_server(tmp: Path, args: list[str]) -> Iterator[FakedServer]:
    """``troth serve ARGS`` under libfaketime, its clock at real time to begin with."""
    offset = tmp / "clock-offset"
    offset.write_text("+0\n")
    env = faked_env(offset)
    port = free_port()
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
