"""The Backend contract, run against every store through :meth:`Store.execute`.

The machine is tested against the memory backend; every other backend must give the
same answers.  Each test here runs on both stores (fixture ``store``); the last tests
drive both with the same random jobs and compare every answer and the snapshots.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers.store_jobs import BIG, EXT, Model, outcomes_of, promise, put, run, schedule
from troth.outbox.codes import SUPERSEDED
from troth.protocol.records import (
    Execute,
    Promise,
    Schedule,
    Task,
    Unblock,
    Value,
)
from troth.store.base import Job, Overlay, Store
from troth.store.memory import MemoryStore
from troth.store.outbox import settle_one
from troth.store.sqlite import SqliteStore

# -- helpers ---------------------------------------------------------------------------


def get_task(tx: Overlay, id: str) -> Task | None:
    return tx.get_task(id)


def outbox(store: Store) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = store.snapshot()["outbox"]
    return rows


# -- round trips -------------------------------------------------------------------------


def test_promise_round_trip_all_fields(store: Store) -> None:
    full = promise(
        "p/1:x",
        "resolved",
        tags={"resonate:target": "poll://any@g", "resonate:branch": "root", "é": "ü"},
        timeout_at=5000,
        created_at=10,
        settled_at=20,
        callbacks=("root", "other"),
        listeners=("poll://any@l", "http://h/x"),
        param=Value({"content-type": "json"}, "eyJhIjoxfQ=="),
        value=Value({}, ""),
    )
    minimal = promise("min", tags={})
    huge = promise("huge", timeout_at=BIG, created_at=2**63 - 1, settled_at=10**30)
    put(store, full, minimal, huge)
    assert run(store, lambda tx: tx.get_promise("p/1:x")) == full
    assert run(store, lambda tx: tx.get_promise("min")) == minimal
    assert run(store, lambda tx: tx.get_promise("huge")) == huge
    assert run(store, lambda tx: tx.get_promise("absent")) is None
    got = run(store, lambda tx: tx.get_promise("p/1:x"))
    assert isinstance(got, Promise) and isinstance(got.callbacks, tuple)


def test_task_round_trip(store: Store) -> None:
    full = Task("t", "acquired", 7, ttl=30_000, pid="w1", expires_at=31_000, resumes=("a", "b"))
    both = Task("both", "suspended", 3, expires_at=5, retry_at=6)
    minimal = Task("m", "fulfilled", 0)
    huge = Task("h", "pending", BIG, ttl=BIG, retry_at=BIG)
    put(store, full, both, minimal, huge)
    for t in (full, both, minimal, huge):
        got = run(store, functools.partial(get_task, id=t.id))
        assert got == t and isinstance(got, Task) and isinstance(got.resumes, tuple)
    assert run(store, lambda tx: tx.get_task("absent")) is None


def test_schedule_round_trip_and_delete(store: Store) -> None:
    s = Schedule(
        id="s",
        cron="0 * * * *",
        promise_id="s.{{.timestamp}}",
        promise_timeout=60_000,
        promise_param=Value({"h": "v"}, "ZGF0YQ=="),
        promise_tags={"resonate:target": "poll://any@g"},
        created_at=1,
        next_run_at=3_600_000,
        last_run_at=0,
    )
    put(store, s, schedule("other"))
    assert run(store, lambda tx: tx.get_schedule("s")) == s

    def delete(tx: Overlay) -> Schedule | None:
        tx.del_schedule("s")
        return tx.get_schedule("s")  # read-your-writes: gone already

    assert run(store, delete) is None
    assert run(store, lambda tx: tx.get_schedule("s")) is None
    assert [x.id for x in run(store, lambda tx: tx.scan_schedules({}, None, 10))] == ["other"]
    assert run(store, lambda tx: tx.due_schedules(10**9, 10)) == ["other"]

    def delete_absent(tx: Overlay) -> None:
        tx.del_schedule("never")

    run(store, delete_absent)  # deleting nothing is fine


def test_upsert_replaces(store: Store) -> None:
    put(store, promise("p", tags=EXT, timeout_at=50))
    put(store, promise("p", "rejected_timedout", tags=EXT, timeout_at=50, settled_at=50))
    got = run(store, lambda tx: tx.get_promise("p"))
    assert got is not None and got.state == "rejected_timedout"
    assert run(store, lambda tx: tx.due_promises(100, 10)) == []
    assert len(store.snapshot()["promises"]) == 1


# -- read-your-writes and group commit -------------------------------------------------------


def test_read_your_writes_inside_a_job(store: Store) -> None:
    put(store, promise("p", timeout_at=1), Task("p", "pending", 0), schedule("s"))

    def job(tx: Overlay) -> tuple[Any, ...]:
        tx.set_promise(promise("p", timeout_at=2))
        tx.set_task(Task("p", "acquired", 1))
        tx.set_promise(promise("new"))
        return (tx.get_promise("p"), tx.get_task("p"), tx.get_promise("new"))

    p, t, new = run(store, job)
    assert p.timeout_at == 2 and t.state == "acquired" and new is not None


def test_later_job_of_a_batch_sees_earlier_one(store: Store) -> None:
    def first(tx: Overlay) -> None:
        tx.set_promise(promise("a"))

    def second(tx: Overlay) -> Promise | None:
        return tx.get_promise("a")

    outcomes = store.execute([Job(first, 0), Job(second, 0)])
    assert outcomes[1].value == promise("a")


def test_group_commit_isolates_a_failing_job(store: Store) -> None:
    def first(tx: Overlay) -> str:
        tx.set_promise(promise("a"))
        tx.set_message("poll://any@a", Execute("a", 0))
        return "first"

    def middle(tx: Overlay) -> str:
        tx.set_promise(promise("b"))
        tx.set_task(Task("b", "pending", 0, retry_at=0))
        tx.set_schedule(schedule("sb"))
        tx.set_message("poll://any@b", Execute("b", 0))
        raise RuntimeError("boom")

    def third(tx: Overlay) -> tuple[str, Promise | None]:
        tx.set_promise(promise("c"))
        return "third", tx.get_promise("b")

    outcomes = store.execute([Job(first, 1), Job(middle, 2), Job(third, 3)])
    assert outcomes[0].value == "first" and outcomes[0].wrote and outcomes[0].error is None
    assert isinstance(outcomes[1].error, RuntimeError) and not outcomes[1].wrote
    assert outcomes[2].value == ("third", None)  # the middle job never reached the backend
    snap = store.snapshot()
    assert [p["id"] for p in snap["promises"]] == ["a", "c"]
    assert snap["tasks"] == [] and snap["schedules"] == []
    assert [(r["key"], r["createdAt"]) for r in snap["outbox"]] == [("a", 1)]


def test_job_without_writes_reports_wrote_false(store: Store) -> None:
    outcome = store.execute([Job(lambda tx: tx.get_promise("x"), 0)])[0]
    assert outcome.error is None and outcome.value is None and not outcome.wrote
    assert store.read(lambda tx: 42) == 42


# -- the outbox ----------------------------------------------------------------------------


def test_execute_messages_are_keyed_by_task(store: Store) -> None:
    def send(version: int) -> Callable[[Overlay], None]:
        def job(tx: Overlay) -> None:
            tx.set_message("poll://any@g", Execute("t1", version))

        return job

    run(store, send(1), now=10)
    run(store, send(2), now=20)
    rows = outbox(store)
    assert len(rows) == 1
    assert rows[0]["message"] == {"kind": "execute", "taskId": "t1", "version": 2}
    assert rows[0]["id"] == 2 and rows[0]["createdAt"] == 20  # a new row, at the back
    assert rows[0]["state"] == "pending" and rows[0]["attempts"] == 0

    def twice(tx: Overlay) -> None:  # within one job, the latest wins too
        tx.set_message("poll://any@g", Execute("t2", 0))
        tx.set_message("poll://any@h", Execute("t2", 5))

    run(store, twice, now=30)
    rows = outbox(store)
    assert [(r["key"], r["address"], r["message"]["version"]) for r in rows] == [
        ("t1", "poll://any@g", 2),
        ("t2", "poll://any@h", 5),
    ]


def test_unblock_messages_are_keyed_per_address(store: Store) -> None:
    p = promise("p", "resolved", settled_at=5, value=Value({}, "b2s="), tags={"k": "v"})
    rec = p.record()

    def notify(*addresses: str) -> Callable[[Overlay], None]:
        def job(tx: Overlay) -> None:
            for a in addresses:
                tx.set_message(a, Unblock(rec))

        return job

    run(store, notify("poll://any@a", "poll://any@b"), now=1)
    run(store, notify("poll://any@a"), now=2)
    rows = outbox(store)
    assert [(r["id"], r["key"]) for r in rows] == [
        (2, "p:notify:poll://any@b"),
        (3, "p:notify:poll://any@a"),
    ]
    assert rows[1]["message"] == {
        "kind": "unblock",
        "promise": {
            "id": "p",
            "state": "resolved",
            "param": {},
            "value": {"data": "b2s="},
            "tags": {"k": "v"},
            "timeoutAt": 1000,
            "createdAt": 0,
            "settledAt": 5,
        },
    }


# -- deadlines --------------------------------------------------------------------------------


def test_due_promises_boundaries(store: Store) -> None:
    put(
        store,
        promise("at-100", tags=EXT, timeout_at=100),
        promise("target", tags={"resonate:target": "poll://any@g"}, timeout_at=90),
        promise("timer", tags={"resonate:timer": "true"}, timeout_at=100),
        promise("internal", tags={}, timeout_at=10),  # not external: no durable deadline
        promise("settled", "resolved", tags=EXT, timeout_at=10, settled_at=5),
        promise("later", tags=EXT, timeout_at=101),
        promise("huge", tags=EXT, timeout_at=BIG),
    )
    assert run(store, lambda tx: tx.due_promises(99, 10)) == ["target"]
    assert run(store, lambda tx: tx.due_promises(100, 10)) == ["target", "at-100", "timer"]
    assert run(store, lambda tx: tx.due_promises(100, 2)) == ["target", "at-100"]
    assert run(store, lambda tx: tx.due_promises(10**12, 10)) == [
        "target",
        "at-100",
        "timer",
        "later",
    ]
    assert run(store, lambda tx: tx.due_promises(BIG, 10))[-1] == "huge"
    assert run(store, lambda tx: tx.due_promises(BIG - 1, 10))[-1] == "later"


def test_due_tasks_boundaries(store: Store) -> None:
    put(
        store,
        Task("retry", "pending", 0, retry_at=50),
        Task("expire", "acquired", 1, ttl=10, pid="w", expires_at=40),
        Task("no-retry", "pending", 0),
        Task("suspended", "suspended", 1, retry_at=1, expires_at=1),
        Task("acq-with-retry", "acquired", 1, retry_at=1, expires_at=60),
        Task("pend-with-exp", "pending", 1, retry_at=60, expires_at=1),
        Task("done", "fulfilled", 1, retry_at=1),
    )
    assert run(store, lambda tx: tx.due_tasks(39, 10)) == []
    assert run(store, lambda tx: tx.due_tasks(40, 10)) == ["expire"]
    assert run(store, lambda tx: tx.due_tasks(50, 10)) == ["expire", "retry"]
    assert run(store, lambda tx: tx.due_tasks(60, 10)) == [
        "expire",
        "retry",
        "acq-with-retry",
        "pend-with-exp",
    ]
    assert run(store, lambda tx: tx.due_tasks(60, 1)) == ["expire"]
    # Re-arming moves the deadline: the old one is gone.
    put(store, Task("retry", "acquired", 1, expires_at=70))
    assert run(store, lambda tx: tx.due_tasks(60, 10)) == [
        "expire",
        "acq-with-retry",
        "pend-with-exp",
    ]


def test_due_schedules(store: Store) -> None:
    put(store, schedule("b", 100), schedule("a", 100), schedule("c", 99), schedule("z", BIG))
    assert run(store, lambda tx: tx.due_schedules(98, 10)) == []
    assert run(store, lambda tx: tx.due_schedules(99, 10)) == ["c"]
    assert run(store, lambda tx: tx.due_schedules(100, 10)) == ["c", "a", "b"]
    assert run(store, lambda tx: tx.due_schedules(100, 2)) == ["c", "a"]


def test_next_deadline_across_kinds(store: Store) -> None:
    assert run(store, lambda tx: tx.next_deadline()) is None
    put(store, promise("internal", timeout_at=1), Task("done", "fulfilled", 0))
    assert run(store, lambda tx: tx.next_deadline()) is None
    put(store, promise("huge", tags=EXT, timeout_at=10**30))
    put(store, schedule("far", 2**70))
    assert run(store, lambda tx: tx.next_deadline()) == 2**70
    put(store, schedule("s", 500))
    assert run(store, lambda tx: tx.next_deadline()) == 500
    put(store, promise("p", tags=EXT, timeout_at=400))
    assert run(store, lambda tx: tx.next_deadline()) == 400
    put(store, Task("t", "acquired", 1, expires_at=300))
    assert run(store, lambda tx: tx.next_deadline()) == 300
    put(store, Task("u", "pending", 0, retry_at=200))
    assert run(store, lambda tx: tx.next_deadline()) == 200
    put(store, Task("u", "suspended", 0, retry_at=200))  # disarmed
    assert run(store, lambda tx: tx.next_deadline()) == 300
    put(store, promise("d", "resolved", settled_at=1, callbacks=("x",)))
    assert run(store, lambda tx: tx.next_deadline()) == 0  # undrained: repair now
    put(store, promise("d", "resolved", settled_at=1))
    assert run(store, lambda tx: tx.next_deadline()) == 300


def test_undrained(store: Store) -> None:
    put(
        store,
        promise("pending-cb", callbacks=("x",)),
        promise("b-settled-cb", "resolved", settled_at=1, callbacks=("x",)),
        promise("a-settled-ls", "rejected", settled_at=1, listeners=("poll://any@l",)),
        promise("settled-empty", "resolved", settled_at=1),
    )
    assert run(store, lambda tx: tx.undrained_promises(10)) == ["a-settled-ls", "b-settled-cb"]
    assert run(store, lambda tx: tx.undrained_promises(1)) == ["a-settled-ls"]
    put(store, promise("a-settled-ls", "rejected", settled_at=1))
    assert run(store, lambda tx: tx.undrained_promises(10)) == ["b-settled-cb"]


# -- scans ------------------------------------------------------------------------------------


def test_scan_promises(store: Store) -> None:
    put(
        store,
        promise("a", tags={"resonate:origin": "r", "k": "1"}),
        promise("b", "resolved", tags={"resonate:origin": "r", "k": "2"}, settled_at=1),
        promise("c", "rejected", tags={"resonate:origin": "s"}, settled_at=1),
        promise("d", tags={'we"ird.key': "x", "k": "1"}),
        promise("e", "rejected_timedout", tags={"resonate:origin": "r"}, settled_at=1),
    )

    def ids(states: Any, tags: dict[str, str], after: str | None, limit: int) -> list[str]:
        return [p.id for p in run(store, lambda tx: tx.scan_promises(states, tags, after, limit))]

    assert ids(None, {}, None, 100) == ["a", "b", "c", "d", "e"]
    assert ids(None, {}, "b", 100) == ["c", "d", "e"]
    assert ids(None, {}, "bb", 2) == ["c", "d"]
    assert ids(None, {}, "e", 10) == []
    assert ids({"pending"}, {}, None, 10) == ["a", "d"]
    assert ids(["rejected", "rejected_timedout"], {}, None, 10) == ["c", "e"]
    assert ids(set(), {}, None, 10) == []
    assert ids(None, {"resonate:origin": "r"}, None, 10) == ["a", "b", "e"]
    assert ids(None, {"resonate:origin": "r", "k": "1"}, None, 10) == ["a"]
    assert ids(None, {"k": "1"}, "a", 10) == ["d"]
    assert ids(None, {'we"ird.key': "x"}, None, 10) == ["d"]
    assert ids(None, {"k": "3"}, None, 10) == []
    assert ids({"resolved", "pending"}, {"resonate:origin": "r"}, None, 1) == ["a"]
    assert ids({"resolved", "pending"}, {"resonate:origin": "r"}, "a", 1) == ["b"]


def test_scan_tasks(store: Store) -> None:
    put(
        store,
        Task("a", "pending", 0),
        Task("b", "acquired", 1),
        Task("c", "pending", 2),
        Task("d", "fulfilled", 3),
    )

    def ids(states: Any, after: str | None, limit: int) -> list[str]:
        return [t.id for t in run(store, lambda tx: tx.scan_tasks(states, after, limit))]

    assert ids(None, None, 10) == ["a", "b", "c", "d"]
    assert ids({"pending"}, None, 10) == ["a", "c"]
    assert ids({"pending"}, "a", 10) == ["c"]
    assert ids(None, "a", 2) == ["b", "c"]
    assert ids((), None, 10) == []


def test_inspection_reads_many_tasks_at_once(store: Store) -> None:
    """``Inspection.tasks``: the tasks of the ids that have one, by id, across the
    reads it splits a long list into; duplicates and absent ids are harmless."""
    many = [Task(f"t{i:04d}", "pending", i) for i in range(1, 1201)]
    put(store, *many)
    ids = ["absent", *[t.id for t in many], "t0001", "t0002"]
    got = store.inspect(lambda ins: ins.tasks(ids))
    assert got == {t.id: t for t in many}
    assert store.inspect(lambda ins: ins.tasks([])) == {}


def test_inspection_search_looks_at_a_bounded_window_and_goes_on_from_it(store: Store) -> None:
    """``Inspection.search``: a tag filter looks at ``window`` ids per call and says
    where to go on; a full page stops early; the origin tag reads its own index."""
    rows = [
        promise(f"p{i:02d}", tags={"team": "a"} if i in (5, 25) else {"team": "b"})
        for i in range(30)
    ]
    flow = [promise(f"w.{i}", tags={"resonate:origin": "w", "k": str(i % 2)}) for i in range(6)]
    put(store, *rows, *flow, promise("q", tags={"team": "a"}))

    def search(after: str | None, limit: int = 50, **tags: str) -> tuple[list[str], Any, int]:
        found = store.inspect(lambda ins: ins.search("p", None, tags, after, limit, window=10))
        return [p.id for p in found.promises], found.next, found.looked

    assert search(None, team="a") == (["p05"], "p09", 10)
    assert search("p09", team="a") == ([], "p19", 10)
    assert search("p19", team="a") == (["p25"], "p29", 10)
    assert search("p29", team="a") == ([], None, 0)  # "q" is past the prefix
    assert search(None, limit=1, team="b") == (["p00"], "p00", 1)
    got = store.inspect(
        lambda ins: ins.search("", None, {"resonate:origin": "w", "k": "1"}, None, 50)
    )
    assert [p.id for p in got.promises] == ["w.1", "w.3", "w.5"] and got.next is None
    assert got.looked == 6  # the workflow's promises only, through the origin index
    pending = store.inspect(lambda ins: ins.search("p", "resolved", {"team": "a"}, None, 50))
    assert pending.promises == [] and pending.next is None and pending.looked == 30


def test_scan_schedules(store: Store) -> None:
    put(
        store,
        schedule("a", tags={"resonate:target": "poll://any@g"}),
        schedule("b", tags={}),
        schedule("c", tags={"resonate:target": "poll://any@g", "x": "y"}),
    )

    def ids(tags: dict[str, str], after: str | None, limit: int) -> list[str]:
        return [s.id for s in run(store, lambda tx: tx.scan_schedules(tags, after, limit))]

    assert ids({}, None, 10) == ["a", "b", "c"]
    assert ids({"resonate:target": "poll://any@g"}, None, 10) == ["a", "c"]
    assert ids({"resonate:target": "poll://any@g"}, "a", 10) == ["c"]
    assert ids({}, None, 1) == ["a"]
    assert ids({"x": "z"}, None, 10) == []


def test_promises_in_branch(store: Store) -> None:
    put(
        store,
        promise("root", tags={"resonate:branch": "root"}),
        promise("root.2", tags={"resonate:branch": "root"}),
        promise("root.1", tags={"resonate:branch": "root"}),
        promise("other", tags={"resonate:branch": "other"}),
        promise("none", tags={}),
        promise("empty", tags={"resonate:branch": ""}),
    )

    def ids(branch: str, limit: int) -> list[str]:
        return [p.id for p in run(store, lambda tx: tx.promises_in_branch(branch, limit))]

    assert ids("root", 10) == ["root", "root.1", "root.2"]
    assert ids("root", 2) == ["root", "root.1"]
    assert ids("other", 10) == ["other"]
    assert ids("missing", 10) == []
    assert ids("", 10) == []
    got = run(store, lambda tx: tx.promises_in_branch("root", 1))
    assert got == [promise("root", tags={"resonate:branch": "root"})]


# -- reset and snapshot -----------------------------------------------------------------------


def test_reset(store: Store) -> None:
    def job(tx: Overlay) -> None:
        tx.set_promise(promise("p", tags=EXT))
        tx.set_task(Task("p", "pending", 0, retry_at=1))
        tx.set_schedule(schedule("s"))
        tx.set_message("poll://any@g", Execute("p", 0))

    run(store, job)
    run(store, job)
    store.reset()
    assert store.snapshot() == {"promises": [], "tasks": [], "schedules": [], "outbox": []}
    assert run(store, lambda tx: tx.next_deadline()) is None
    run(store, job)
    assert [r["id"] for r in outbox(store)] == [1]  # ids start over, as in a fresh store


def test_snapshot_shape(store: Store) -> None:
    def job(tx: Overlay) -> None:
        tx.set_promise(promise("p", "resolved", settled_at=3, callbacks=("c",)))
        tx.set_task(Task("p", "fulfilled", 1, resumes=("r",)))
        tx.set_schedule(schedule("s"))
        tx.set_message("poll://any@g", Execute("p", 1))

    run(store, job, now=7)
    snap = store.snapshot()
    assert snap["promises"] == [
        {
            "id": "p",
            "state": "resolved",
            "param": {},
            "value": {},
            "tags": {},
            "timeoutAt": 1000,
            "createdAt": 0,
            "settledAt": 3,
            "callbacks": ["c"],
            "listeners": [],
        }
    ]
    assert snap["tasks"] == [{"id": "p", "state": "fulfilled", "version": 1, "resumes": ["r"]}]
    assert snap["schedules"] == [
        {
            "id": "s",
            "cron": "*/5 * * * *",
            "promiseId": "s.{{.timestamp}}",
            "promiseTimeout": 60000,
            "promiseParam": {},
            "promiseTags": {},
            "createdAt": 0,
            "nextRunAt": 100,
        }
    ]
    # The outbox row's shape is store/snapshot.py's snap_row (shared); check what apply wrote.
    [row] = snap["outbox"]
    assert row["id"] == 1 and row["key"] == "p" and row["address"] == "poll://any@g"
    assert row["message"] == {"kind": "execute", "taskId": "p", "version": 1}
    assert row["state"] == "pending" and row["attempts"] == 0 and row["createdAt"] == 7


# -- the outbox lifecycle (store.outbox) ------------------------------------------------------


def send(store: Store, *messages: tuple[str, Execute | Unblock], now: int) -> None:
    def job(tx: Overlay) -> None:
        for address, message in messages:
            tx.set_message(address, message)

    run(store, job, now)


def test_claim_due_in_available_order(store: Store) -> None:
    life = store.outbox
    send(store, ("poll://any@g", Execute("b", 0)), now=20)
    send(store, ("poll://any@g", Execute("a", 0)), now=10)
    send(store, ("poll://any@g", Execute("c", 0)), now=30)
    assert life.next_due() == 10
    assert life.claim_due("w", 9, 10, "t0") == []
    claimed = life.claim_due("w", 25, 10, "t1")
    assert [(r.id, r.key) for r in claimed] == [(2, "a"), (1, "b")]
    row = claimed[0]
    assert (row.state, row.claim_token, row.claimed_by, row.claimed_at) == (
        "dispatching",
        "t1",
        "w",
        25,
    )
    assert row.updated_at == 25 and row.available_at == 10 and row.created_at == 10
    assert row.entry.message == Execute("a", 0) and row.address == "poll://any@g"
    assert life.next_due() == 30
    assert [r.key for r in life.claim_due("w", 100, 1, "t2")] == ["c"]
    assert life.next_due() is None
    assert life.claim_due("w", 100, 10, "t3") == []


def test_settle_is_fenced_by_the_claim_token(store: Store) -> None:
    life = store.outbox
    send(store, ("poll://any@g", Execute("a", 0)), now=1)
    [row] = life.claim_due("w", 1, 10, "tok")
    assert not settle_one(life, row.id, "other", "completed", 2)
    assert not settle_one(life, 999, "tok", "completed", 2)
    assert settle_one(life, row.id, "tok", "completed", 2)
    assert not settle_one(life, row.id, "tok", "completed", 3)  # no longer held
    [snap] = store.snapshot()["outbox"]
    assert (snap["state"], snap["attempts"]) == ("completed", 0)


def test_retry_requeues_or_is_superseded(store: Store) -> None:
    life = store.outbox
    send(store, ("poll://any@g", Execute("a", 0)), ("poll://any@g", Execute("b", 0)), now=1)
    a, b = life.claim_due("w", 1, 10, "tok")
    # While "a" is in flight, a newer message for its key arrives: it must not replace
    # the claimed row, and the retry of the old one is then superseded.
    send(store, ("poll://any@g", Execute("a", 1)), now=2)
    assert settle_one(life, a.id, "tok", "pending", 3, "busy", 50)
    assert settle_one(life, b.id, "tok", "pending", 3, "busy", 40)
    rows = {r["id"]: r for r in store.snapshot()["outbox"]}
    assert (rows[a.id]["state"], rows[a.id]["attempts"]) == ("completed", 1)
    assert rows[a.id].get("lastCode", SUPERSEDED) == SUPERSEDED
    assert (rows[b.id]["state"], rows[b.id]["attempts"]) == ("pending", 1)
    assert rows[3]["message"]["version"] == 1 and rows[3]["state"] == "pending"
    assert life.next_due() == 2
    assert [r.id for r in life.claim_due("w", 45, 10, "t2")] == [3, b.id]
    # A requeued row is the pending row of its key again: a new message replaces it.
    assert settle_one(life, b.id, "t2", "pending", 46, None, None)
    send(store, ("poll://any@g", Execute("b", 9)), now=47)
    keys = [(r["id"], r["key"], r["state"]) for r in store.snapshot()["outbox"]]
    assert (b.id, "b", "pending") not in keys and (4, "b", "pending") in keys


def test_failure_unknown_and_reconciliation(store: Store) -> None:
    life = store.outbox
    send(store, *[("poll://any@g", Execute(k, 0)) for k in "abcd"], now=1)
    a, b, c, d = life.claim_due("w", 1, 10, "tok")
    assert settle_one(life, a.id, "tok", "failed", 2, "boom")
    assert settle_one(life, b.id, "tok", "outcome_unknown", 2, "timeout")
    assert settle_one(life, c.id, "tok", "outcome_unknown", 2, "timeout")
    assert [r.id for r in life.unknown_rows(10)] == [b.id, c.id]
    assert [r.id for r in life.unknown_rows(1)] == [b.id]
    assert not settle_one(life, a.id, None, "completed", 3, None)  # not unknown
    assert settle_one(life, b.id, None, "pending", 3, "resend")
    assert settle_one(life, c.id, None, "failed", 3, "gave up")
    assert not settle_one(life, c.id, None, "completed", 3, None)
    rows = {r["id"]: r for r in store.snapshot()["outbox"]}
    assert (rows[a.id]["state"], rows[a.id]["attempts"]) == ("failed", 1)
    assert (rows[b.id]["state"], rows[b.id]["attempts"]) == ("pending", 0)
    assert rows[c.id]["state"] == "failed"
    assert life.next_due() == 3
    # The reaper: d was claimed at 1 and never settled.
    assert life.release_expired_claims(1, 10, "expired") == 0
    assert life.release_expired_claims(2, 10, "expired") == 1
    assert [r.id for r in life.unknown_rows(10)] == [d.id]
    [unknown] = life.unknown_rows(10)
    assert unknown.claim_token is None and unknown.last_code == "expired"
    assert unknown.claimed_by == "w" and unknown.claimed_at == 1


def test_the_reaper_from_a_floor_releases_only_the_claims_taken_since(store: Store) -> None:
    """A pass from ``since`` leaves a claim taken before it (a pass from the bottom
    takes it), and takes one taken at or after it."""
    life = store.outbox
    send(store, ("poll://any@g", Execute("a", 0)), now=1)
    [a] = life.claim_due("w", 1, 10, "tok")
    send(store, ("poll://any@g", Execute("b", 0)), now=5)
    [b] = life.claim_due("w", 5, 10, "tok")
    assert life.release_expired_claims(10, 20, "expired", since=6) == 0
    assert life.release_expired_claims(10, 20, "expired", since=5) == 1
    assert [r.id for r in life.unknown_rows(10)] == [b.id]
    assert life.release_expired_claims(10, 20, "expired", since=2) == 0
    assert life.release_expired_claims(10, 20, "expired") == 1
    assert [r.id for r in life.unknown_rows(10)] == [a.id, b.id]


def test_purge_completed(store: Store) -> None:
    life = store.outbox
    send(store, *[("poll://any@g", Execute(k, 0)) for k in "abc"], now=1)
    a, b, c = life.claim_due("w", 1, 10, "tok")
    settle_one(life, a.id, "tok", "completed", 5)
    settle_one(life, b.id, "tok", "completed", 9)
    settle_one(life, c.id, "tok", "failed", 1, "x")
    assert life.purge_completed(5) == 0
    assert life.purge_completed(6) == 1
    assert [r["id"] for r in store.snapshot()["outbox"]] == [b.id, c.id]
    assert life.purge_completed(100) == 1
    assert [r["id"] for r in store.snapshot()["outbox"]] == [c.id]


# -- differential: memory and sqlite answer alike -----------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_same_answers_as_memory(seed: int, tmp_path: Path) -> None:
    model = Model(seed)
    memory, sqlite = MemoryStore(), SqliteStore(tmp_path / "d.db", synchronous="normal")
    try:
        for step in range(120):
            batch = [
                Job(model.job(), model.rng.randint(0, 30)) for _ in range(model.rng.randint(1, 3))
            ]
            assert outcomes_of(memory, batch) == outcomes_of(sqlite, batch), step
            for _ in range(2):
                q = model.query()
                assert memory.read(q) == sqlite.read(q), step
            for _ in range(model.rng.randint(0, 3)):
                op = model.lifecycle()
                assert op(memory) == op(sqlite), step
            if step % 40 == 39:
                assert memory.snapshot() == sqlite.snapshot(), step
            if step == 80:
                memory.reset()
                sqlite.reset()
        assert memory.snapshot() == sqlite.snapshot()
    finally:
        sqlite.close()


def test_snapshots_equal_after_same_jobs(tmp_path: Path) -> None:
    memory, sqlite = MemoryStore(), SqliteStore(tmp_path / "s.db")
    rec = promise("p", "resolved", settled_at=2, tags={"resonate:origin": "o"}).record()

    def job(tx: Overlay) -> None:
        tx.set_promise(promise("p", "resolved", settled_at=2, listeners=("poll://any@l",)))
        tx.set_task(Task("p", "fulfilled", 3, ttl=5, pid="w", resumes=("q",)))
        tx.set_schedule(schedule("s", tags={"resonate:target": "poll://any@g"}))
        tx.set_message("poll://any@l", Unblock(rec))
        tx.set_message("poll://any@g", Execute("p", 3))

    try:
        for store in (memory, sqlite):
            run(store, job, now=5)
            run(store, job, now=6)
        assert memory.snapshot() == sqlite.snapshot()
        assert len(memory.snapshot()["outbox"]) == 2
    finally:
        sqlite.close()
