"""A promise tagged ``resonate:scope: global`` is external (docs/protocol.md).

troth's compatibility extension of SPEC.md §2.3: besides ``resonate:external: "true"``,
a target or a timer, the tag ``resonate:scope`` exactly ``"global"`` makes a promise
external — awaitable by a suspended task (callbacks), by listeners, and with a durable
deadline.  The TypeScript SDK 0.11.5 tags the promise of ``ctx.promise()`` only that
way; before this rule, the ``task.suspend`` that awaited it was refused with 422 and
the SDK spun (release, re-acquire, replay, suspend, 422, …) until it was settled.
``resonate:scope: local`` (the SDKs' ``ctx.run`` children) or any other value stays
internal.

Over the wire on every backend (fixture ``server``: memory, SQLite, PostgreSQL), plus
scripts replayed against the reference model (``model.mapping.replay``), which
carries the same definition, so the two readings still agree step by step.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg
import pytest

from helpers.support import RunningServer
from model.mapping import replay

NOW = 1000
FAR = 10**12
TGT = {"resonate:target": "poll://any@workers"}
ROOT_TAGS = {**TGT, "resonate:origin": "root", "resonate:branch": "root"}


def child_tags(id: str, scope: str | None) -> dict[str, str]:
    """The tags the TS SDK puts on ``ctx.promise()`` (lineage + scope), no external."""
    tags = {"resonate:branch": id, "resonate:parent": "root", "resonate:origin": "root"}
    if scope is not None:
        tags["resonate:scope"] = scope
    return tags


def action(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "head": {}, "data": data}


def callback(awaited: str, awaiter: str) -> dict[str, Any]:
    return action("promise.register_callback", {"awaited": awaited, "awaiter": awaiter})


def create_root(server: RunningServer) -> None:
    """``task.create`` of the workflow's root: acquired by w1 at version 1."""
    data = {"id": "root", "timeoutAt": FAR, "tags": ROOT_TAGS}
    body = server.ok(
        "task.create", {"pid": "w1", "ttl": 60_000, "action": action("promise.create", data)}, NOW
    )
    assert body["task"]["state"] == "acquired" and body["task"]["version"] == 1, body


def fence_child(server: RunningServer, id: str, tags: dict[str, str], timeout_at: int) -> None:
    """The workflow creates its awaitable child through ``task.fence``, as the SDKs do."""
    data = {"id": id, "timeoutAt": timeout_at, "tags": tags}
    body = server.ok(
        "task.fence", {"id": "root", "version": 1, "action": action("promise.create", data)}, NOW
    )
    inner = body["action"]
    assert inner["head"]["status"] == 200, body
    assert inner["data"]["promise"]["state"] == "pending"
    assert inner["data"]["promise"]["tags"] == tags  # stored as given


def suspend(server: RunningServer, *awaited: str, now: int = NOW) -> tuple[int, Any]:
    actions = [callback(a, "root") for a in awaited]
    return server.call("task.suspend", {"id": "root", "version": 1, "actions": actions}, now)


def stored(server: RunningServer) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(promises, tasks)`` by id, as stored (``debug.snap``: not projected)."""
    snap = server.snap()
    return {p["id"]: p for p in snap["promises"]}, {t["id"]: t for t in snap["tasks"]}


# ---------------------------------------------------------------------- task.suspend


def test_suspend_awaiting_a_scope_global_child_suspends(server: RunningServer) -> None:
    """The issue's reproduction: ``task.create`` a root, ``task.fence`` create
    ``root.0`` tagged ``resonate:scope: global`` (no external tag, no target), then
    ``task.suspend`` awaiting it: 200 (suspended; was 422), the callback is registered,
    and settling ``root.0`` from outside wakes the root at its version."""
    create_root(server)
    fence_child(server, "root.0", child_tags("root.0", "global"), FAR)

    assert suspend(server, "root.0") == (200, {})
    promises, tasks = stored(server)
    assert promises["root.0"]["callbacks"] == ["root"]
    assert tasks["root"]["state"] == "suspended"

    # Another client settles it: the suspended root resumes and is offered again.
    settle = {"id": "root.0", "state": "resolved", "value": {"data": "eWVz"}}
    assert server.ok("promise.settle", settle, NOW + 10)["promise"]["state"] == "resolved"
    promises, tasks = stored(server)
    assert promises["root.0"]["callbacks"] == []  # drained by r4
    assert tasks["root"]["state"] == "pending"
    assert tasks["root"]["version"] == 1
    execute = server.outbox()["root"]
    assert execute["address"] == TGT["resonate:target"]
    assert execute["message"] == {"kind": "execute", "taskId": "root", "version": 1}

    # The woken workflow acquires it, sees the answer, and fulfils.
    body = server.ok(
        "task.acquire", {"id": "root", "version": 1, "pid": "w1", "ttl": 60_000}, NOW + 20
    )
    assert body["task"]["state"] == "acquired"
    version = body["task"]["version"]
    done = {"id": "root", "state": "resolved", "value": {}}
    fulfil = {"id": "root", "version": version, "action": action("promise.settle", done)}
    assert server.ok("task.fulfill", fulfil, NOW + 30)["promise"]["state"] == "resolved"


def test_suspend_awaiting_a_settled_scope_global_child_answers_300(
    server: RunningServer,
) -> None:
    """Already settled (the answer came before the workflow waited): 300 with the
    preload, the task stays acquired at its version, nothing registered."""
    create_root(server)
    fence_child(server, "root.0", child_tags("root.0", "global"), FAR)
    server.ok("promise.settle", {"id": "root.0", "state": "resolved", "value": {}}, NOW)

    status, body = suspend(server, "root.0")
    assert status == 300, body
    assert "preload" in body
    promises, tasks = stored(server)
    assert promises["root.0"]["callbacks"] == []
    assert tasks["root"]["state"] == "acquired" and tasks["root"]["version"] == 1


@pytest.mark.parametrize("scope", ["local", "Global", "", "true", None])
def test_suspend_awaiting_a_promise_not_scoped_global_is_refused(
    server: RunningServer, scope: str | None
) -> None:
    """``scope: local`` (a ``ctx.run`` child), another value, or no scope tag: not
    external (SPEC.md T-06 step 3) → 422, and the refusal changes nothing."""
    create_root(server)
    fence_child(server, "root.0", child_tags("root.0", scope), FAR)
    before = server.snap()

    status, body = suspend(server, "root.0")
    assert status == 422, body
    assert "not external" in body
    assert server.snap() == before


def test_one_internal_awaited_promise_refuses_the_whole_suspend(server: RunningServer) -> None:
    """422 takes priority wherever the internal promise is in the list (T-06 step 3):
    a scope-global one beside a scope-local one does not make the suspend pass."""
    create_root(server)
    fence_child(server, "root.0", child_tags("root.0", "global"), FAR)
    fence_child(server, "root.1", child_tags("root.1", "local"), FAR)
    assert suspend(server, "root.0", "root.1")[0] == 422
    assert suspend(server, "root.1", "root.0")[0] == 422
    assert suspend(server, "root.0")[0] == 200


# ---------------------------------------------------------------------- P-04 / P-05


@pytest.mark.parametrize(("scope", "status"), [("global", 200), ("local", 422)])
def test_callbacks_and_listeners(server: RunningServer, scope: str, status: int) -> None:
    """P-04 step 5 and P-05 step 3 use the same predicate: a scope-global promise
    takes a callback and a listener, a scope-local one refuses both."""
    create_root(server)
    tags = {"resonate:scope": scope}
    server.ok("promise.create", {"id": "p", "timeoutAt": FAR, "tags": tags}, NOW)

    got, _ = server.call("promise.register_callback", {"awaited": "p", "awaiter": "root"}, NOW)
    assert got == status
    address = "poll://uni@hitl/w2"
    got, _ = server.call("promise.register_listener", {"awaited": "p", "address": address}, NOW)
    assert got == status

    promises, _ = stored(server)
    registered = (promises["p"]["callbacks"], promises["p"]["listeners"])
    assert registered == ((["root"], [address]) if status == 200 else ([], []))


# ---------------------------------------------------------------------- the deadline


def test_the_deadline_of_a_scope_global_promise_is_durable(server: RunningServer) -> None:
    """External ⇒ on the timer's index (SPEC.md C1): at its deadline r1 persists the
    timeout, which drains its callback and wakes the awaiting workflow.  Without it the
    suspended root would never be woken."""
    create_root(server)
    fence_child(server, "root.0", child_tags("root.0", "global"), 5000)
    assert suspend(server, "root.0") == (200, {})

    server.tick(4999)
    assert stored(server)[1]["root"]["state"] == "suspended"
    server.tick(5000)
    promises, tasks = stored(server)
    assert promises["root.0"]["state"] == "rejected_timedout"
    assert promises["root.0"]["settledAt"] == 5000
    assert promises["root.0"]["callbacks"] == []
    assert tasks["root"]["state"] == "pending"
    assert "root" in server.outbox()


def _set_external_column(server: RunningServer, ids: list[str], value: bool) -> None:
    """Write the stored ``external`` column, as a row from before the rule has it."""
    if server.settings.store == "sqlite":
        with sqlite3.connect(server.settings.db, timeout=10) as conn:
            marks = ",".join("?" * len(ids))
            conn.execute(f"UPDATE promises SET external = ? WHERE id IN ({marks})", [value, *ids])
    else:
        with psycopg.connect(server.settings.postgres_url, autocommit=True) as pg:
            pg.execute("UPDATE promises SET external = %s WHERE id = ANY(%s)", (value, ids))


def _external_column(server: RunningServer, id: str) -> bool:
    if server.settings.store == "sqlite":
        with sqlite3.connect(server.settings.db, timeout=10) as conn:
            row = conn.execute("SELECT external FROM promises WHERE id = ?", (id,)).fetchone()
    else:
        with psycopg.connect(server.settings.postgres_url, autocommit=True) as pg:
            row = pg.execute("SELECT external FROM promises WHERE id = %s", (id,)).fetchone()
    assert row is not None, id
    return bool(row[0])


def test_a_row_stored_before_the_rule_needs_no_migration(server: RunningServer) -> None:
    """docs/protocol.md: rows stored before this rule keep ``external`` = false in the
    SQLite and PostgreSQL stores; no migration rewrites them.  Such a row has no
    ledgers, so leaving it off the timer's index changes nothing a client reads, and
    the first write that gives it an obligation rewrites the column.  Simulated here
    by clearing the column of two scope-global promises: the one a workflow then
    awaits is back on the index and its deadline wakes the workflow; the untouched one
    is not persisted by r1 but reads as timed out all the same.  (The memory store
    keeps no such column: both are persisted there.)"""
    create_root(server)
    for id in ("old-awaited", "old-untouched"):
        tags = {"resonate:scope": "global"}
        server.ok("promise.create", {"id": id, "timeoutAt": 5000, "tags": tags}, NOW)
    durable_column = server.settings.store != "memory"
    if durable_column:
        _set_external_column(server, ["old-awaited", "old-untouched"], False)
        assert not _external_column(server, "old-awaited")

    assert suspend(server, "old-awaited") == (200, {})
    if durable_column:
        assert _external_column(server, "old-awaited")  # re-derived by the write
        assert not _external_column(server, "old-untouched")

    server.tick(5000)
    promises, tasks = stored(server)
    assert promises["old-awaited"]["state"] == "rejected_timedout"
    assert tasks["root"]["state"] == "pending"  # woken by the deadline
    untouched = "pending" if durable_column else "rejected_timedout"
    assert promises["old-untouched"]["state"] == untouched
    got = server.ok("promise.get", {"id": "old-untouched"}, 5000)["promise"]
    assert (got["state"], got["settledAt"]) == ("rejected_timedout", 5000)


# ---------------------------------------------------------------------- the model agrees


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def _create(id: str, timeout_at: int, tags: dict[str, str]) -> dict[str, Any]:
    return {"id": id, "timeoutAt": timeout_at, "tags": tags}


def test_model_and_troth_agree_on_scope_tags(store: str) -> None:
    """troth against the reference model (answers, whole stores, the catalogue's 95
    properties after every step, among them ``obligations_require_external``): the
    SDK-shaped human-in-the-loop run, a listener, a scope-local refusal, and deadlines
    of both kinds of promise fired by a tick."""
    replay(
        store,
        [
            ("task.create", {"pid": "w1", "ttl": 60_000, "action": action(
                "promise.create", _create("root", 60_000, ROOT_TAGS))}),
            ("task.fence", {"id": "root", "version": 1, "action": action(
                "promise.create", _create("root:0", 20_000, child_tags("root:0", "global")))}),
            ("task.fence", {"id": "root", "version": 1, "action": action(
                "promise.create", _create("root:1", 20_000, child_tags("root:1", "local")))}),
            ("task.suspend", {"id": "root", "version": 1, "actions": [callback("root:1", "root")]}),
            ("task.suspend", {"id": "root", "version": 1, "actions": [callback("root:0", "root")]}),
            ("promise.register_listener", {"awaited": "root:0", "address": "poll://uni@g/l"}),
            ("promise.register_listener", {"awaited": "root:1", "address": "poll://uni@g/l"}),
            ("promise.create", _create("g", 3000, {"resonate:scope": "global"})),
            ("promise.create", _create("l", 3000, {"resonate:scope": "local"})),
            ("promise.register_callback", {"awaited": "g", "awaiter": "root"}),
            ("promise.register_callback", {"awaited": "l", "awaiter": "root"}),
            ("advance", 2500),
            ("tick", None),
            ("promise.settle", {"id": "root:0", "state": "resolved", "value": {"data": "eWVz"}}),
            ("task.acquire", {"id": "root", "version": 1, "pid": "w1", "ttl": 60_000}),
            ("task.suspend", {"id": "root", "version": 2, "actions": [callback("root:0", "root")]}),
            ("advance", 20_000),
            ("tick", None),
        ],
    )  # fmt: skip


def test_model_and_troth_agree_on_a_scope_global_timeout_waking_a_workflow(store: str) -> None:
    """The deadline side, step by step against the model: a suspended root woken by
    r1 on its scope-global child's deadline, then re-dispatched by r6."""
    replay(
        store,
        [
            ("task.create", {"pid": "w1", "ttl": 60_000, "action": action(
                "promise.create", _create("root", 60_000, ROOT_TAGS))}),
            ("task.fence", {"id": "root", "version": 1, "action": action(
                "promise.create", _create("root:0", 4000, child_tags("root:0", "global")))}),
            ("task.suspend", {"id": "root", "version": 1, "actions": [callback("root:0", "root")]}),
            ("advance", 2999),
            ("tick", None),
            ("advance", 1),
            ("tick", None),
            ("advance", 5000),
            ("tick", None),
        ],
    )  # fmt: skip
