"""How long the dashboard's views take on the server, on a big store.

``python -m troth_bench.ui [N]`` seeds N settled promises (``troth_bench.seed``;
default 1,000,000) into a SQLite file (or, with ``--postgres URL``, into a fresh
database on that server, dropped afterwards), adds the 100-promise stuck workflow ``wf`` of
``troth_bench.explain`` and a schedule, builds the whole app and times, per view,
every request that view's page makes (the HTTP app driven in-process over httpx's
ASGI transport: routing, auth-free handling, the store's reads, the JSON; no socket,
no browser).  Prints p50 and max of ``--repeat`` runs per request, in milliseconds,
and the view's total (its requests one after the other; the page makes them at once).

``/ops/counts`` is timed twice: the first count (a scan of every table) and the
answer reused after it — the overview draws its other blocks without waiting for it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import httpx

from troth.server.config import Settings
from troth.server.run import build_app
from troth.store.base import Store
from troth.store.sqlite import SqliteStore
from troth_bench import pg
from troth_bench.explain import stuck_workflow
from troth_bench.seed import seed_store

HOUR = 3_600_000


def envelope(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "head": {"corrId": "bench", "version": "2026-04-01"}, "data": data}


def tags(key: str, value: str) -> str:
    """A ``tags`` query parameter: a JSON object, URL-encoded."""
    return quote(json.dumps({key: value}) + "&limit=50", safe="&=")


#: Each view: the requests its page makes (GET path, or a protocol request).
VIEWS: list[tuple[str, list[str | tuple[str, dict[str, Any]]]]] = [
    ("page files (/ui/, app.js, app.css)", ["/ui/", "/ui/app.js", "/ui/app.css"]),
    (
        "overview (counts aside)",
        [
            "/ops/workers",
            "/ops/outbox?state=failed&limit=10",
            "/ops/outbox?state=outcome_unknown&limit=10",
            "/metrics",
        ],
    ),
    ("workflows: first page, no filter", ["/ops/promises?limit=50"]),
    ("workflows: prefix seed-0099", ["/ops/promises?prefix=seed-0099&limit=50"]),
    ("workflows: state pending", ["/ops/promises?state=pending&limit=50"]),
    ("workflows: tags origin=wf", ["/ops/promises?tags=" + tags("resonate:origin", "wf")]),
    (
        "workflows: tags scope=global (no index)",
        ["/ops/promises?tags=" + tags("resonate:scope", "global")],
    ),
    (
        "workflows: a tag no promise has (no index)",
        ["/ops/promises?tags=" + tags("team", "nobody")],
    ),
    (
        "(not the dashboard's) promise.search, a tag no promise has",
        [("promise.search", {"tags": {"team": "nobody"}, "limit": 50})],
    ),
    (
        "workflow wf (100 promises)",
        ["/ops/explain?id=wf", "/ops/tree?id=wf&limit=1000", "/ops/timeline?id=wf&limit=200"],
    ),
    ("promise + task wf.rpc", ["/ops/promise?id=wf.rpc", "/ops/outbox?task=wf.rpc&limit=50"]),
    ("delivery: newest 50", ["/ops/outbox?limit=50"]),
    ("workers", ["/ops/workers"]),
    ("schedules", [("schedule.search", {"limit": 50})]),
]


async def measure(settings: Settings, repeat: int) -> list[tuple[str, str, float, float]]:
    app = build_app(settings)
    await app.startup()
    out: list[tuple[str, str, float, float]] = []
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://troth") as c:
            schedule = {
                "id": "nightly",
                "cron": "0 3 * * *",
                "promiseId": "report.{{.timestamp}}",
                "promiseTimeout": HOUR,
            }
            r = await c.post("/", json=envelope("schedule.create", schedule))
            assert r.status_code == 200, r.text

            async def once(req: str | tuple[str, dict[str, Any]]) -> float:
                started = time.perf_counter()
                if isinstance(req, str):
                    r = await c.get(req)
                else:
                    r = await c.post("/", json=envelope(*req))
                took = (time.perf_counter() - started) * 1000
                assert r.status_code == 200, (req, r.status_code, r.text[:200])
                return took

            first = await once("/ops/counts")
            reused = statistics.median([await once("/ops/counts") for _ in range(repeat)])
            out.append(("overview: counts", "/ops/counts (first: scans)", first, first))
            out.append(("overview: counts", "/ops/counts (reused)", reused, reused))
            for view, reqs in VIEWS:
                for req in reqs:
                    samples = [await once(req) for _ in range(repeat)]
                    if isinstance(req, str):
                        name = unquote(req)
                    else:
                        name = f"POST / {req[0]} {json.dumps(req[1])}"
                    out.append((view, name, statistics.median(samples), max(samples)))
    finally:
        await app.shutdown()
    return out


def seed(store: Store, count: int, what: str) -> None:
    print(f"seeding {count:,} settled promises ({what}) ...", flush=True)
    seconds = seed_store(store, count, "seed-")
    stuck_workflow(store, "wf", time.time_ns() // 1_000_000)
    store.close()
    print(f"seeded in {seconds:.1f} s; one 100-promise workflow `wf` added", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m troth_bench.ui")
    parser.add_argument("count", nargs="?", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument(
        "--postgres",
        metavar="URL",
        help="a PostgreSQL server (its maintenance database) to seed a fresh database on",
    )
    args = parser.parse_args(argv)
    if args.postgres:
        from troth.store.postgres import PostgresStore

        with pg.throwaway(args.postgres, "troth_bench_ui") as url:
            seed(PostgresStore(url), args.count, "postgres")
            settings = Settings(store="postgres", postgres_url=url, access_log=False)
            rows = asyncio.run(measure(settings, args.repeat))
    else:
        with tempfile.TemporaryDirectory(prefix="troth-ui-") as tmp:
            db = Path(tmp) / "troth.db"
            seed(SqliteStore(db, synchronous="normal"), args.count, "sqlite")
            settings = Settings(store="sqlite", db=str(db), synchronous="normal", access_log=False)
            rows = asyncio.run(measure(settings, args.repeat))
    print(f"{'view':36} {'request':58} {'p50 ms':>8} {'max ms':>8}")
    totals: dict[str, float] = {}
    for view, name, p50, worst in rows:
        totals[view] = totals.get(view, 0.0) + p50
        print(f"{view:36} {name[:58]:58} {p50:8.2f} {worst:8.2f}")
    print("\nper view, its requests' p50 added up:")
    for view, total in totals.items():
        print(f"  {view:36} {total:8.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
