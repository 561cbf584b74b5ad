"""The faked clock the clock-step tests rely on is exact (``helpers.faketime``).

Those tests count the steps a server noticed against the steps they made, so every
reading of the faked wall clock, in every thread, must be real time plus what the
offset file held at that moment.  Here a process under the same environment has
threads read the wall clock outside the GIL, as C code does, while its main thread
samples it between two monotonic readings and the test rewrites the offset every
0.1 s; no sample may show an offset the file did not hold during its bracket.  Under
``libfaketime.so.1`` (unserialised) some do: real time, the library's fallback when
it opens a file name another thread is rewriting.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from helpers.faketime import faked_env, set_offset

#: Under faked time: three threads read CLOCK_REALTIME through ctypes (which lets go
#: of the GIL) until stdin closes; the main thread samples ``(monotonic, wall ms,
#: monotonic)`` meanwhile, says ``ready`` after its first sample (at offset 0), and
#: prints every sample as one JSON line at the end.
READERS = r"""
import ctypes, json, sys, threading, time

class Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]

libc = ctypes.CDLL(None)
done = threading.Event()

def wall_ms(ts):
    libc.clock_gettime(0, ctypes.byref(ts))
    return ts.sec * 1000 + ts.nsec / 1e6

def hammer():
    ts = Timespec()
    while not done.is_set():
        libc.clock_gettime(0, ctypes.byref(ts))

def sample(ts):
    m0 = time.monotonic()
    wall = wall_ms(ts)
    return (m0, wall, time.monotonic())

ts = Timespec()
samples = [sample(ts)]
print("ready", flush=True)
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
for _ in range(3):
    threading.Thread(target=hammer, daemon=True).start()
while not done.is_set():
    samples.append(sample(ts))
print(json.dumps(samples), flush=True)
"""

HOUR = 3600


def test_every_thread_reads_the_offset_the_file_holds(tmp_path: Path) -> None:
    offset = tmp_path / "clock-offset"
    offset.write_text("+0\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", READERS],
        env=faked_env(offset),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline() == b"ready\n"
        # (first monotonic instant it may have been read at, last, offset)
        held: list[tuple[float, float, int]] = [(0.0, 0.0, 0)]
        for i in range(25):
            value = (HOUR, -HOUR, 0)[i % 3]
            before = time.monotonic()
            set_offset(offset, value)
            held.append((before, time.monotonic(), value))
            time.sleep(0.1)
        out, _ = proc.communicate(b"", timeout=30)
    finally:
        proc.kill()
        proc.wait()
    samples: list[list[float]] = json.loads(out)
    first = samples[0]
    base = first[1] - first[0] * 1000  # wall - monotonic at offset 0
    wrong = []
    for m0, wall, m1 in samples[1:]:
        seen = round((wall - m0 * 1000 - base) / 1000 / HOUR) * HOUR
        # What the file held when the bracket began, and whatever was written within it.
        allowed = {[v for _, done, v in held if done < m0][-1]}
        allowed |= {v for began, done, v in held if began <= m1 and done >= m0}
        if seen not in allowed:
            wrong.append((round(m0, 3), seen, sorted(allowed)))
    assert len(samples) > 100, "too few samples to mean anything"
    assert wrong == [], f"{len(wrong)} of {len(samples)} readings were off: {wrong[:10]}"
