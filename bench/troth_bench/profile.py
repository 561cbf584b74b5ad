"""Optional server profiles with py-spy, one per workload, taken during its window.

py-spy samples the server from outside (``--nonblocking``: the server is not paused,
so the figures of a profiled run stay close to an unprofiled one).  It is a
measuring tool, not a dependency: ``pip install py-spy`` into the venv to use
``--profile DIR``.  Each workload leaves ``DIR/<workload>.txt`` (collapsed stacks,
one line per stack, for flame-graph tools) and the summary the bench prints: per
thread, the functions that were on CPU themselves (self) and with their callees
(total), as a share of that thread's samples.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from troth.plural import counted
from troth_bench.measure import Window

#: Frames that are on every stack of their thread and say nothing about cost.
_PLUMBING = (
    "_bootstrap",
    "_bootstrap_inner",
    "run (threading.py)",
    "<module>",
    "_run_module_as_main",
    "_run_code",
    "main (troth/cli/main.py)",
    "serve (troth/server/run.py)",
    "run (uvicorn",
    "run (asyncio/runners.py)",
    "run_until_complete",
    "run_forever",
)


def find_py_spy() -> str | None:
    """py-spy next to this interpreter (the venv), else on PATH."""
    local = Path(sys.executable).parent / "py-spy"
    if local.exists():
        return str(local)
    return shutil.which("py-spy")


@dataclass
class ThreadProfile:
    name: str
    samples: int = 0
    own: Counter[str] = field(default_factory=Counter)
    total: Counter[str] = field(default_factory=Counter)

    def top(self, which: str, n: int) -> list[tuple[str, float]]:
        counts = self.own if which == "self" else self.total
        rows = [
            (f, c / self.samples)
            for f, c in counts.most_common()
            if which == "self" or not any(p in f for p in _PLUMBING)
        ]
        return rows[:n]


def _function(frame: str) -> str:
    """``name (path/to/file.py:123)`` → ``name (to/file.py)``: aggregate over lines."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    elif "/src/" in path:
        path = path.split("/src/", 1)[1]
    elif "/lib/python" in path:
        path = path.split("/lib/python", 1)[1].split("/", 1)[-1]
    return f"{name} ({path})"


def summarize(text: str) -> dict[str, ThreadProfile]:
    """Collapsed py-spy stacks (``--threads --format raw``) → per-thread profiles."""
    threads: dict[str, ThreadProfile] = {}
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        head, _, rest = stack.partition(";")
        thread = head.split(": ", 1)[-1] if ": " in head else head
        frames = [_function(f) for f in rest.split(";") if f]
        if not frames:
            continue
        prof = threads.setdefault(thread, ThreadProfile(thread))
        prof.samples += count
        prof.own[frames[-1]] += count
        for f in set(frames):
            prof.total[f] += count
    return threads


class Profiler:
    """Records the server while a workload's window is open."""

    def __init__(self, directory: Path, pid: int, mode: str = "gil", rate: int = 100) -> None:
        self.directory = directory
        self.pid = pid
        self.mode = mode
        self.rate = rate
        self.exe = find_py_spy()
        self.profiles: dict[str, dict[str, ThreadProfile]] = {}
        self.errors: dict[str, str] = {}

    async def during(self, name: str, window: Window) -> None:
        if self.exe is None:
            self.errors[name] = "py-spy not found (pip install py-spy into the venv)"
            return
        await asyncio.sleep(max(0.0, window.begin - time.perf_counter()))
        seconds = max(1, int(window.end - time.perf_counter()))
        self.directory.mkdir(parents=True, exist_ok=True)
        out = self.directory / f"{name}.txt"
        proc = await asyncio.create_subprocess_exec(
            self.exe,
            "record",
            "--pid",
            str(self.pid),
            "--duration",
            str(seconds),
            "--rate",
            str(self.rate),
            "--format",
            "raw",
            "--nonblocking",
            "--threads",
            *(["--gil"] if self.mode == "gil" else []),
            "-o",
            str(out),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
        if proc.returncode != 0 or not out.exists():
            self.errors[name] = err.decode(errors="replace").strip()[-300:]
            return
        self.profiles[name] = summarize(out.read_text())


def render(name: str, threads: dict[str, ThreadProfile], n: int = 12) -> list[str]:
    """Per thread: the top functions by self time, then by total (inclusive) time."""
    lines: list[str] = []
    for thread in sorted(threads.values(), key=lambda t: -t.samples):
        lines.append(f"  {name} · thread {thread.name} · {counted(thread.samples, 'sample')}")
        for which in ("self", "total"):
            lines.append(f"    by {which} time:")
            for function, share in thread.top(which, n):
                lines.append(f"      {share:6.1%}  {function}")
    return lines
