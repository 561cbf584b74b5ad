"""The operator API: read-only JSON over ``GET /ops/…``, beside the protocol's
``POST /`` (which stays pure: nothing here is a protocol request).

=======================  ===============================================================
``/ops/explain?id=ID``   why ``ID`` is not done (``troth explain``; ops/explain.py)
``/ops/promises``        promises by id ``prefix``, ``state`` and ``tags`` (JSON), in id
                         order (``after``); ``order=desc``: the latest ``limit`` under
                         the prefix
``/ops/outbox``          outbox rows, newest first: ``state``, ``task``, ``before``, ``limit``
``/ops/workers``         connected workers by group and node, groups' last seen, nodes
``/ops/counts``          rows by state: promises, tasks, outbox; schedules
``/ops/bounces``         tasks bouncing now (server/delivery/bounces.py)
``/ops/promise?id=ID``   one promise with its callbacks and listeners, and its task
``/ops/tree?id=ID``      a workflow's promises (by ``resonate:origin``) with their tasks
``/ops/timeline?id=ID``  its promises' and tasks' events in one order (ops/timeline.py)
=======================  ===============================================================

Reads go through ``Store.inspect`` in a worker thread (no row locks; on SQLite a
WAL reader beside the writer), so the request path pays nothing for them.  When auth
is on, every path here needs an admin token (the app checks before calling in).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import parse_qs

import msgspec

from troth.ops.explain import explain, row_json
from troth.ops.facts import gather
from troth.ops.timeline import EXECUTES_PER_TASK, timeline
from troth.ops.workers import ClusterView, local_view
from troth.outbox.rows import RowState
from troth.protocol.records import PROMISE_STATES
from troth.server.delivery.bounces import BounceTracker
from troth.store.base import Store
from troth.store.inspection import TREE_LIMIT
from troth.transport.poll import Registry

#: Most rows one ``/ops/outbox`` page returns.
MAX_LIMIT: Final = 1000
#: Seconds a count may take before its answer is reused (see ``counts``).
COUNTS_CACHE_FROM: Final = 0.05
STATES: Final = frozenset(s.value for s in RowState)

Answer = tuple[int, Any]


class Refused(Exception):
    """A bad operator request: its status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class OperatorApi:
    """Answers ``GET /ops/…`` from the store, the registry (or the cluster's tables)
    and the bounce tracker."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        bounces: BounceTracker,
        clock: Callable[[], int],
        *,
        node: str,
        url: str,
        cluster_view: Callable[[], Any] | None = None,
        nats_state: Callable[[], str] | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.bounces = bounces
        self.clock = clock
        self.node = node
        self.url = url
        self.started_at = clock()
        # The schema this node serves (one read at start; a memory store has none).
        read_schema = getattr(store, "schema_version", None)
        self.schema: int | None = read_schema() if callable(read_schema) else None
        #: Several nodes: ``Cluster.view`` (an awaitable ClusterView).
        self.cluster_view = cluster_view
        #: This node's NATS connection in a word (``ClusterView.nats``), for explain.
        self.nats_state = nats_state or (lambda: "off")
        self._counts: tuple[float, dict[str, Any]] | None = None
        self.routes: dict[str, Callable[[dict[str, str]], Any]] = {
            "/ops/explain": self.explain,
            "/ops/promises": self.promises,
            "/ops/outbox": self.outbox,
            "/ops/workers": self.workers,
            "/ops/counts": self.counts,
            "/ops/bounces": self.bouncing,
            "/ops/promise": self.promise,
            "/ops/tree": self.tree,
            "/ops/timeline": self.timeline,
        }

    async def answer(self, path: str, query: bytes) -> Answer:
        route = self.routes.get(path.rstrip("/"))
        if route is None:
            return 404, {"error": f"no operator route {path}; try {', '.join(self.routes)}"}
        try:
            params = {k: v[-1] for k, v in parse_qs(query.decode("latin-1")).items()}
        except ValueError:
            return 400, {"error": "malformed query string"}
        try:
            return 200, await route(params)
        except Refused as exc:
            return exc.status, {"error": str(exc)}

    async def view(self) -> ClusterView:
        if self.cluster_view is not None:
            view: ClusterView = await self.cluster_view()
        else:
            now = self.clock()
            view = local_view(self.registry, self.node, self.url, self.started_at, now, self.schema)
        view.nats = self.nats_state()
        return view

    # -- routes -----------------------------------------------------------------------

    async def explain(self, params: dict[str, str]) -> Any:
        id = params.get("id")
        if not id:
            raise Refused(400, "explain needs ?id=<promise or schedule id>")
        facts = await asyncio.to_thread(self.store.inspect, lambda ins: gather(ins, id))
        view = await self.view()
        now = self.clock()
        result = explain(facts, view, lambda task: self.bounces.episode(task, now), now)
        return result.as_json()

    async def promises(self, params: dict[str, str]) -> Any:
        """Promises by id prefix (and state), in id order: a range read, never a scan
        of the table (``pending`` has an index of its own)."""
        state = params.get("state") or None
        if state is not None and state not in PROMISE_STATES:
            raise Refused(400, f"state must be one of {', '.join(sorted(PROMISE_STATES))}")
        limit = _int(params, "limit", 100, 1, MAX_LIMIT)
        prefix = params.get("prefix", "")
        after = params.get("after") or None
        tags = _tags(params.get("tags") or "")
        if params.get("order") == "desc":  # the latest under a prefix, no paging
            if state is not None or after is not None or tags:
                raise Refused(400, "order=desc takes a prefix and a limit only")
            found = await asyncio.to_thread(
                self.store.inspect, lambda ins: ins.newest(prefix, limit)
            )
            return {"promises": [msgspec.to_builtins(p.record()) for p in found], "next": None}
        if tags:
            # A tag filter no index covers looks at a bounded window of ids per call
            # (Inspection.search), off the writer: never a scan of the table.
            page = await asyncio.to_thread(
                self.store.inspect, lambda ins: ins.search(prefix, state, tags, after, limit)
            )
            return {
                "promises": [msgspec.to_builtins(p.record()) for p in page.promises],
                "next": page.next,
                "looked": page.looked,
            }
        found = await asyncio.to_thread(
            self.store.inspect, lambda ins: ins.promises(prefix, state, after, limit)
        )
        items = [msgspec.to_builtins(p.record()) for p in found]
        return {"promises": items, "next": found[-1].id if len(found) == limit else None}

    async def outbox(self, params: dict[str, str]) -> Any:
        state = params.get("state") or None
        if state is not None and state not in STATES:
            raise Refused(400, f"state must be one of {', '.join(sorted(STATES))}")
        limit = _int(params, "limit", 100, 1, MAX_LIMIT)
        before = _int(params, "before", None, 1, 2**62)
        task = params.get("task") or None

        def read(ins: Any) -> list[Any]:
            if task is not None:
                rows = ins.deliveries(task, limit if before is None else MAX_LIMIT)
                return [r for r in rows if before is None or r.id < before][:limit]
            rows = ins.outbox(state, before, limit)
            return list(rows)

        rows = await asyncio.to_thread(self.store.inspect, read)
        items = [row_json(r) for r in rows]
        cursor = items[-1]["id"] if len(items) == limit else None
        return {"rows": items, "next": cursor}

    async def workers(self, params: dict[str, str]) -> Any:
        view = await self.view()
        now = view.now if view.now is not None else self.clock()
        groups: dict[str, list[dict[str, Any]]] = {}
        for c in view.connections:
            groups.setdefault(c.group, []).append({"pid": c.pid, "node": c.node, "since": c.since})
        return {
            "now": now,
            "groups": [
                {
                    "group": g,
                    "connections": groups.get(g, []),
                    "lastSeen": view.last_seen.get(g),
                }
                for g in sorted(set(groups) | set(view.last_seen))
            ],
            "nodes": [
                {
                    "node": n.node,
                    "url": n.url,
                    "startedAt": n.started_at,
                    "seenAt": n.seen_at,
                    "alive": n.alive,
                    "release": n.release,
                    "schema": n.schema,
                }
                for n in view.nodes
            ],
        }

    async def counts(self, params: dict[str, str]) -> Any:
        """Counting scans every table (about 0.6 s for a million SQLite promises): a
        count that took long is reused for 20 times as long, so that a dashboard
        polling it costs the store at most about 5 % of a core; small stores are
        always counted afresh."""
        at = time.monotonic()
        cached = self._counts
        if cached is not None and at < cached[0]:
            return {**cached[1], "cached": True}
        counts = await asyncio.to_thread(self.store.inspect, lambda ins: ins.counts())
        took = time.monotonic() - at
        answer = {**counts, "seconds": round(took, 4), "at": self.clock()}
        self._counts = (at + 20 * took, answer) if took > COUNTS_CACHE_FROM else None
        return answer

    async def bouncing(self, params: dict[str, str]) -> Any:
        now = self.clock()
        out = []
        for task in list(self.bounces.tasks):
            e = self.bounces.episode(task, now)
            if e is None:
                continue
            out.append(
                {
                    "task": task,
                    "bounces": e.count,
                    "firstAt": e.first_at,
                    "lastAt": e.last_at,
                    "heldUntil": e.due_at if e.due_at > now else None,
                    "group": e.group,
                    "lastRefusal": e.refusal.describe() if e.refusal is not None else None,
                }
            )
        return {"node": self.node, "tasks": out}

    async def promise(self, params: dict[str, str]) -> Any:
        """Every stored field of a promise and its task, which the protocol's
        ``promise.get`` and ``task.get`` leave out: who waits on the promise
        (callbacks, listeners), the lease's deadline, the next retry, the resumes."""
        id = params.get("id")
        if not id:
            raise Refused(400, "promise needs ?id=<promise id>")

        def read(ins: Any) -> tuple[Any, Any]:
            return ins.promise(id), ins.task(id)

        p, t = await asyncio.to_thread(self.store.inspect, read)
        return {
            "promise": msgspec.to_builtins(p) if p is not None else None,
            "task": msgspec.to_builtins(t) if t is not None else None,
            "now": self.clock(),
        }

    async def tree(self, params: dict[str, str]) -> Any:
        """A workflow's call graph in one snapshot: its promises (index read by
        ``resonate:origin``, at most ``limit``) and the task of each that has one —
        one inspection instead of a ``task.get`` per node from the browser."""
        id = params.get("id")
        if not id:
            raise Refused(400, "tree needs ?id=<root promise id>")
        limit = _int(params, "limit", 1000, 1, TREE_LIMIT)

        def read(ins: Any) -> tuple[list[Any], dict[str, Any]]:
            root = ins.promise(id)
            found = [p for p in ins.tree(id, limit + 1) if p.id != id]
            promises = ([root] if root is not None else []) + found
            found_tasks = ins.tasks([p.id for p in promises[: limit + 1]])
            tasks = {id: msgspec.to_builtins(t) for id, t in found_tasks.items()}
            return promises, tasks

        promises, tasks = await asyncio.to_thread(self.store.inspect, read)
        cut = len(promises) > limit + 1
        return {
            "id": id,
            "now": self.clock(),
            "promises": [msgspec.to_builtins(p.record()) for p in promises[: limit + 1]],
            "tasks": tasks,
            "cut": cut,
        }

    async def timeline(self, params: dict[str, str]) -> Any:
        """A workflow's events, oldest first, the last ``limit`` of them: its promises
        (as ``tree`` reads them, at most ``TREE_LIMIT``), their tasks, and each task's
        newest executes (an index read per task).  Events whose time the store does
        not record come with ``at`` null (ops/timeline.py says which)."""
        id = params.get("id")
        if not id:
            raise Refused(400, "timeline needs ?id=<root promise id>")
        limit = _int(params, "limit", 200, 1, 20 * MAX_LIMIT)

        def read(ins: Any) -> tuple[list[Any], dict[str, Any], dict[str, Any], bool]:
            root = ins.promise(id)
            found = [p for p in ins.tree(id) if p.id != id]
            promises = ([root] if root is not None else []) + found
            tasks = ins.tasks([p.id for p in promises])
            executes = {id: ins.deliveries(id, EXECUTES_PER_TASK) for id in tasks}
            return promises, tasks, executes, len(found) >= TREE_LIMIT

        promises, tasks, executes, cut = await asyncio.to_thread(self.store.inspect, read)
        events = timeline(promises, tasks, executes)
        return {
            "id": id,
            "now": self.clock(),
            "total": len(events),
            "events": [e.as_json() for e in events[-limit:]],
            "cut": cut,
        }


def _tags(text: str) -> dict[str, str]:
    """``tags``: a JSON object of strings (``{"resonate:origin": "order-42"}``)."""
    if not text:
        return {}
    try:
        tags = msgspec.json.decode(text, type=dict[str, str])
    except msgspec.DecodeError:
        raise Refused(400, 'tags must be a JSON object of strings: {"key": "value"}') from None
    return tags


def _int(params: dict[str, str], name: str, default: int | None, low: int, high: int) -> Any:
    text = params.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise Refused(400, f"{name} must be an integer") from None
    if not low <= value <= high:
        raise Refused(400, f"{name} must be between {low} and {high}")
    return value
