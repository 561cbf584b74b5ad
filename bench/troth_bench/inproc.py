"""The store and machine work of a request, in-process: no HTTP, no event loop.

``python -m troth_bench.inproc create-settle|lifecycle [N]`` runs N requests through
group commit on a SQLite file (``synchronous=OFF``: the fsync is not what this
measures) in batches of 64, and prints the CPU microseconds per request.  On a
machine whose speed drifts (a shared VM), compare two trees by instructions
instead, which do not drift: run it under ``valgrind --tool=callgrind`` at two
sizes and divide the difference of the totals by the difference of the requests
(docs/performance-notes.md, "Measuring a change").
"""

from __future__ import annotations

import resource
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from troth.machine.core import handle
from troth.machine.internal import Config
from troth.outbox.rows import RowState, Settlement
from troth.protocol import requests as rq
from troth.protocol.records import Value
from troth.store.base import Job, Overlay
from troth.store.sqlite import SqliteStore

BATCH = 64
NOW = 1_000_000
FAR = 10**13
_CONFIG = Config()
_HEAD: dict[str, Any] = {"version": "2026-04-01"}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _job(req: rq.Req) -> Job[Any]:
    def run(tx: Overlay) -> Any:
        response = handle(tx, req, NOW, _CONFIG, _HEAD)
        if response.status >= 300:
            raise RuntimeError(f"{req}: {response}")
        return response

    return Job(run, NOW)


def _execute(store: SqliteStore, jobs: list[Job[Any]]) -> None:
    for outcome in store.execute(jobs):
        outcome.result()


def _create_settle(store: SqliteStore, first: int) -> int:
    jobs: list[Job[Any]] = []
    for i in range(first, first + BATCH):
        id = f"p{i}"
        jobs.append(_job(rq.PromiseCreate(id=id, timeout_at=FAR, param=Value(), tags={})))
        jobs.append(_job(rq.PromiseSettle(id=id, state="resolved", value=Value())))
    _execute(store, jobs)
    return len(jobs)


def _lifecycle(store: SqliteStore, first: int) -> int:
    """Targeted create → claim its execute → acquire → fulfill → settle the row."""
    tags = {"resonate:target": "poll://any@g"}
    creates = [
        _job(rq.PromiseCreate(id=f"t{i}", timeout_at=FAR, param=Value(), tags=tags))
        for i in range(first, first + BATCH)
    ]
    _execute(store, creates)
    rows = store.outbox.claim_due("w", NOW, BATCH, "tok")
    ids = [row.key for row in rows]
    _execute(store, [_job(rq.TaskAcquire(id=id, version=0, pid="w", ttl=60_000)) for id in ids])
    fulfils = []
    for id in ids:
        settle = msgspec.json.encode({"id": id, "state": "resolved", "value": {}})
        action = rq.Action(kind="promise.settle", data=msgspec.Raw(settle))
        fulfils.append(_job(rq.TaskFulfill(id=id, version=1, action=action)))
    _execute(store, fulfils)
    store.outbox.settle([Settlement(r.id, "tok", RowState.COMPLETED, NOW) for r in rows])
    return len(creates) * 3


WORKLOADS: dict[str, Callable[[SqliteStore, int], int]] = {
    "create-settle": _create_settle,
    "lifecycle": _lifecycle,
}


def measure(workload: str, count: int) -> float:
    """CPU microseconds per request of ``count`` promises through ``workload``."""
    step = WORKLOADS[workload]
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "inproc.db", synchronous="normal")
        try:
            store.conn.execute("PRAGMA synchronous = OFF")
            started, requests = _cpu(), 0
            for first in range(0, count, BATCH):
                requests += step(store, first)
            return (_cpu() - started) / requests * 1e6
        finally:
            store.close()


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in WORKLOADS:
        print(f"usage: python -m troth_bench.inproc {{{'|'.join(WORKLOADS)}}} [N]")
        return 2
    count = int(argv[1]) if len(argv) > 1 else 6400
    print(f"{argv[0]}: {measure(argv[0], count):.1f} µs CPU per request ({count:,} promises)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
