"""How fast ``troth explain`` and the operator reads answer on a big store.

``python -m troth_bench.explain [N] [--postgres URL]`` seeds N settled promises
(``troth_bench.seed``; default 1,000,000), adds one 100-promise workflow stuck the
usual ways (a suspended root awaiting an RPC to a group with no worker, a durable
sleep, a human's answer, and 96 settled steps), then times what the server does for
``GET /ops/explain`` — ``Store.inspect(gather)`` and ``explain`` — and the other
operator reads, on the store's own inspection path (no HTTP).  Prints p50 and max of
``--repeat`` runs (default 20) per read, in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import msgspec

from troth.machine.core import handle
from troth.machine.internal import Config
from troth.ops.explain import explain
from troth.ops.facts import gather
from troth.ops.workers import ClusterView
from troth.plural import counted
from troth.protocol import requests as rq
from troth.protocol.records import Value
from troth.store.base import Job, Overlay, Store
from troth_bench.seed import seed_store

HOUR = 3_600_000
_CONFIG = Config()
_HEAD: dict[str, Any] = {"version": "2026-04-01"}


def _run(store: Store, reqs: list[rq.Req], now: int) -> None:
    def job(tx: Overlay) -> None:
        for req in reqs:
            response = handle(tx, req, now, _CONFIG, _HEAD)
            if response.status >= 300:
                raise RuntimeError(f"{req}: {response}")

    store.execute([Job(job, now)])[0].result()


def stuck_workflow(store: Store, root: str, now: int) -> None:
    """A 100-promise workflow: 96 settled steps and three awaited leaves."""

    def child(id: str, **tags: str) -> rq.PromiseCreate:
        lineage = {"resonate:origin": root, "resonate:parent": root, **tags}
        return rq.PromiseCreate(id=id, timeout_at=now + HOUR, param=Value(), tags=lineage)

    target = {"resonate:origin": root, "resonate:target": "poll://any@workers"}
    reqs: list[rq.Req] = [
        rq.PromiseCreate(id=root, timeout_at=now + HOUR, param=Value(), tags=target)
    ]
    for k in range(96):
        reqs.append(child(f"{root}.{k:03d}", **{"resonate:scope": "local"}))
        reqs.append(rq.PromiseSettle(id=f"{root}.{k:03d}", state="resolved", value=Value()))
    reqs.append(child(f"{root}.rpc", **{"resonate:target": "poll://any@nobody"}))
    reqs.append(child(f"{root}.sleep", **{"resonate:timer": "true"}))
    reqs.append(child(f"{root}.ask", **{"resonate:scope": "global"}))
    reqs.append(rq.TaskAcquire(id=root, version=0, pid="w1", ttl=60_000))
    _run(store, reqs, now)
    awaited = [
        {
            "kind": "promise.register_callback",
            "head": {},
            "data": {"awaited": f"{root}.{leaf}", "awaiter": root},
        }
        for leaf in ("rpc", "sleep", "ask")
    ]
    body = {"id": root, "version": 1, "actions": awaited}  # acquire made it 1
    suspend = rq.decode_data("task.suspend", msgspec.json.encode(body))
    _run(store, [suspend], now)


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples), max(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m troth_bench.explain")
    parser.add_argument("count", nargs="?", type=int, default=1_000_000)
    parser.add_argument("--postgres", help="a PostgreSQL URL (its tables are written to)")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="troth-explain-") as tmp:
        store: Store
        if args.postgres:
            from troth.store.postgres import PostgresStore

            store = PostgresStore(args.postgres)
        else:
            from troth.store.sqlite import SqliteStore

            store = SqliteStore(Path(tmp) / "troth.db", synchronous="normal")
        with closing(store):
            print(f"seeding {args.count:,} settled promises ({store.name}) ...", flush=True)
            seconds = seed_store(store, args.count, "seed-")
            now = time.time_ns() // 1_000_000
            stuck_workflow(store, "wf", now)
            print(f"seeded in {seconds:.1f} s; one 100-promise workflow `wf` added")
            view = ClusterView(now=now)

            def explain_wf() -> None:
                facts = store.inspect(lambda ins: gather(ins, "wf"))
                answer = explain(facts, view, lambda task: None, time.time_ns() // 1_000_000)
                assert {f.reason for f in answer.root.leaves()} == {
                    "no_worker",
                    "sleeping",
                    "awaiting_settlement",
                }, answer.as_json()

            reads: list[tuple[str, Callable[[], Any]]] = [
                ("explain wf (100 promises)", explain_wf),
                ("tree by origin (100 promises)", lambda: store.inspect(lambda i: i.tree("wf"))),
                (
                    "outbox page, state=failed",
                    lambda: store.inspect(lambda i: i.outbox("failed", None, 100)),
                ),
                (
                    "deliveries of one task",
                    lambda: store.inspect(lambda i: i.deliveries("wf.rpc", 50)),
                ),
                ("counts by state (scans)", lambda: store.inspect(lambda i: i.counts())),
            ]
            runs = counted(args.repeat, "run")
            print(f"{'read':34} {'p50 ms':>8} {'max ms':>8}   ({runs} each)")
            for name, fn in reads:
                repeat = args.repeat if "counts" not in name else max(3, args.repeat // 5)
                p50, worst = timed(fn, repeat)
                print(f"{name:34} {p50:8.2f} {worst:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
