"""Earlier releases of troth, taken from the repository's history, run beside this one.

A release is the ``src/`` tree of a commit (``git archive``), put into a venv of its
own that shares this checkout's dependency versions: the venv is made without pip,
and one ``.pth`` file puts the old tree first on its path and this venv's
site-packages (the same msgspec, uvicorn, psycopg …) after it.  This venv's own
editable install of troth is a ``.pth`` file in that directory, which a path entry
does not run, so ``import troth`` there is the old tree.  Nothing is downloaded:
building one takes about a second.

And :class:`Node`: a ``troth serve`` child process (of any release) on a free port,
stopped with SIGTERM (killed if it lingers) when the test ends, even if it failed.
"""

from __future__ import annotations

import io
import itertools
import subprocess
import sys
import sysconfig
import tarfile
import time
from pathlib import Path
from typing import Any

import httpx

from helpers.support import VERSION, free_port

REPO = Path(__file__).resolve().parents[2]
_corr = itertools.count(1)


def has_commit(commit: str) -> bool:
    """Whether this clone holds ``commit`` (a shallow clone, or a tree without git,
    may not)."""
    try:
        found = subprocess.run(
            ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
            capture_output=True,
            check=False,
            timeout=30,
        )
    except OSError:
        return False
    return found.returncode == 0


def build(commit: str, where: Path) -> Path:
    """The python of a venv running troth as of ``commit``; built under ``where``."""
    tree = where / "src"
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, "src"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    venv = where / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
    )
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    Path(site, "troth-release.pth").write_text(f"{tree}\n{ours}\n", encoding="utf-8")
    return python


class Node:
    """``troth serve`` on PostgreSQL, run by ``python`` (a release's or this one's)."""

    def __init__(self, python: Path | str, name: str, url: str, log_dir: Path) -> None:
        self.python = str(python)
        self.name = name
        self.url = url
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self, *extra: str) -> list[str]:
        return [
            *[self.python, "-m", "troth.cli.main", "serve", "--store", "postgres"],
            *["--postgres-url", self.url, "--host", "127.0.0.1", "--port", str(self.port)],
            *["--node-id", self.name, "--log-level", "warning", *extra],
        ]

    def start(self, *extra: str) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv(*extra), stdout=out, stderr=out)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited at start: {self.output()}")
            try:
                if httpx.get(f"{self.base}/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{self.name} not ready in 30 s: {self.output()}")

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def call(self, kind: str, data: Any) -> tuple[int, Any]:
        head = {"corrId": f"{self.name}-{next(_corr)}", "version": VERSION}
        r = httpx.post(f"{self.base}/", json={"kind": kind, "head": head, "data": data}, timeout=10)
        body = r.json()
        return int(body["head"]["status"]), body["data"]

    def ok(self, kind: str, data: Any) -> Any:
        status, answer = self.call(kind, data)
        assert status == 200, (self.name, kind, data, status, answer)
        return answer

    def ops(self, route: str, **params: str) -> Any:
        r = httpx.get(f"{self.base}/ops/{route}", params=params, timeout=10)
        assert r.status_code == 200, (route, params, r.status_code, r.text)
        return r.json()
