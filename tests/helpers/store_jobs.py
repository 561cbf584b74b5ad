"""Jobs and records for the store tests: one-job batches (``run``, ``put``), record
builders, and ``Model``, the random jobs, queries and outbox-lifecycle calls that
every backend must answer alike (test_store_contract.py, test_store_postgres.py).
"""

from __future__ import annotations

import random
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from troth.protocol.records import Execute, Promise, Schedule, Task, Unblock, Value
from troth.store.base import BatchClaim, Job, Overlay, Store
from troth.store.outbox import settle_one
from troth.store.sqlite import SqliteStore

T = TypeVar("T")

BIG = 2**64 + 7  # beyond SQLite's 64-bit integers; the protocol's naturals are unbounded


def run(
    store: Store,
    fn: Callable[[Overlay], T],
    now: int = 0,
    *,
    claim_in_batch: Callable[[], BatchClaim | None] | None = None,
) -> T:
    """One job, one batch (asking ``claim_in_batch`` what to claim in it, as the
    engine asks the delivery); re-raise its error."""
    outcome = store.execute([Job(fn, now)], claim_in_batch)[0]
    if outcome.error is not None:
        raise outcome.error
    return outcome.value  # type: ignore[return-value]


def put(store: Store, *objs: Promise | Task | Schedule, now: int = 0) -> None:
    def job(tx: Overlay) -> None:
        for o in objs:
            if isinstance(o, Promise):
                tx.set_promise(o)
            elif isinstance(o, Task):
                tx.set_task(o)
            else:
                tx.set_schedule(o)

    run(store, job, now)


def promise(
    id: str,
    state: str = "pending",
    *,
    tags: dict[str, str] | None = None,
    timeout_at: int = 1000,
    created_at: int = 0,
    settled_at: int | None = None,
    callbacks: tuple[str, ...] = (),
    listeners: tuple[str, ...] = (),
    param: Value | None = None,
    value: Value | None = None,
) -> Promise:
    return Promise(
        id=id,
        state=state,
        param=param or Value(),
        value=value or Value(),
        tags=tags if tags is not None else {},
        timeout_at=timeout_at,
        created_at=created_at,
        settled_at=settled_at,
        callbacks=callbacks,
        listeners=listeners,
    )


EXT = {"resonate:external": "true"}


def schedule(id: str, next_run_at: int = 100, tags: dict[str, str] | None = None) -> Schedule:
    return Schedule(
        id=id,
        cron="*/5 * * * *",
        promise_id=f"{id}.{{{{.timestamp}}}}",
        promise_timeout=60_000,
        promise_param=Value(),
        promise_tags=tags if tags is not None else {},
        created_at=0,
        next_run_at=next_run_at,
    )


IDS = ["a", "b", "c", "d", "e", "f"]
STATES = ["pending", "resolved", "rejected", "rejected_canceled", "rejected_timedout"]
TASK_STATES = ["pending", "acquired", "suspended", "halted", "fulfilled"]
TAG_CHOICES: list[dict[str, str]] = [
    {},
    {"resonate:external": "true"},
    {"resonate:target": "poll://any@g", "resonate:branch": "a"},
    {"resonate:timer": "true", "resonate:branch": "b", "resonate:origin": "b"},
    {"resonate:origin": "a", "resonate:branch": "a"},
]


class Model:
    """Random jobs over a small id space, so upserts, re-arms and collisions are common."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        # Tags never change after birth (as in the protocol), so fix them per id.
        self.tags = {id: self.rng.choice(TAG_CHOICES) for id in IDS}

    def opt(self, hi: int = 30) -> int | None:
        return None if self.rng.random() < 0.3 else self.rng.randint(0, hi)

    def promise(self) -> Promise:
        r = self.rng
        id = r.choice(IDS)
        state = r.choice(STATES)
        return promise(
            id,
            state,
            tags=self.tags[id],
            timeout_at=r.choice([r.randint(0, 30), BIG]),
            created_at=r.randint(0, 30),
            settled_at=None if state == "pending" else r.randint(0, 30),
            # Mostly drained, so next_deadline is not always 0.
            callbacks=tuple(r.sample(IDS, r.choice([0, 0, 0, 0, 1, 2]))),
            listeners=tuple(r.sample(["poll://any@x", "http://h/y"], r.choice([0, 0, 0, 1]))),
            value=r.choice([Value(), Value({"h": "v"}, "ZA==")]),
        )

    def task(self) -> Task:
        r = self.rng
        return Task(
            r.choice(IDS),
            r.choice(TASK_STATES),
            r.randint(0, 5),
            ttl=self.opt(),
            pid=r.choice([None, "w1"]),
            expires_at=self.opt(),
            retry_at=self.opt(),
            resumes=tuple(r.sample(IDS, r.randint(0, 2))),
        )

    def job(self) -> Callable[[Overlay], Any]:
        r = self.rng
        ops: list[tuple[str, Any]] = []
        for _ in range(r.randint(1, 4)):
            kind = r.randrange(6)
            if kind == 0:
                ops.append(("promise", self.promise()))
            elif kind == 1:
                ops.append(("task", self.task()))
            elif kind == 2:
                s = schedule(r.choice(IDS), r.randint(0, 30), self.tags[r.choice(IDS)])
                ops.append(("schedule", s))
            elif kind == 3:
                ops.append(("delete", r.choice(IDS)))
            elif kind == 4:
                m = Execute(r.choice(IDS), r.randint(0, 5))
                ops.append(("message", (r.choice(["poll://any@g", "poll://any@h"]), m)))
            else:
                u = Unblock(self.promise().record())
                ops.append(("message", (r.choice(["poll://any@x", "http://h/y"]), u)))
        fail = r.random() < 0.15

        def job(tx: Overlay) -> Any:
            seen = [tx.get_promise(id) for id in IDS]
            for kind, arg in ops:
                if kind == "promise":
                    tx.set_promise(arg)
                elif kind == "task":
                    tx.set_task(arg)
                elif kind == "schedule":
                    tx.set_schedule(arg)
                elif kind == "delete":
                    tx.del_schedule(arg)
                else:
                    tx.set_message(*arg)
            if fail:
                raise ValueError("discarded")
            return seen + [tx.get_task(id) for id in IDS] + [tx.get_schedule(id) for id in IDS]

        return job

    def lifecycle(self) -> Callable[[Store], Any]:
        """One call of the outbox lifecycle, drawn once and applied to each store."""
        r = self.rng
        kind = r.randrange(8)
        now, token, worker = r.randint(0, 31), r.choice(["t1", "t2"]), r.choice(["w1", "w2"])
        row_id, limit = r.randint(1, 12), r.randint(1, 4)
        state = r.choice(["pending", "completed", "failed", "outcome_unknown"])
        code, at = r.choice([None, "c1", "c2"]), r.choice([None, r.randint(0, 40)])

        def op(store: Store) -> Any:
            life = store.outbox
            if kind <= 1:
                return life.claim_due(worker, now, limit, token)
            if kind == 2:
                return settle_one(life, row_id, token, state, now, code, at)
            if kind == 3:
                return life.unknown_rows(limit)
            if kind == 4:
                return settle_one(life, row_id, None, state, now, code)
            if kind == 5:
                return life.release_expired_claims(now - 10, now, "expired")
            if kind == 6:
                return life.purge_completed(now - 5)
            return life.next_due()

        return op

    def query(self) -> Callable[[Overlay], Any]:
        r = self.rng
        now, limit = r.randint(0, 31), r.randint(1, 7)
        after = r.choice([None, *IDS, "c0"])
        states = r.choice([None, set(r.sample(STATES, r.randint(0, 3)))])
        tstates = r.choice([None, set(r.sample(TASK_STATES, r.randint(0, 3)))])
        tags = r.choice([{}, {"resonate:origin": "a"}, {"resonate:branch": "b"}, {"x": "y"}])
        branch = r.choice(["a", "b", "c"])
        return lambda tx: (
            tx.due_promises(now, limit),
            tx.due_tasks(now, limit),
            tx.due_schedules(now, limit),
            tx.undrained_promises(limit),
            tx.next_deadline(),
            tx.scan_promises(states, tags, after, limit),
            tx.scan_tasks(tstates, after, limit),
            tx.scan_schedules(tags, after, limit),
            tx.promises_in_branch(branch, limit),
        )


def outcomes_of(store: Store, jobs: list[Job[Any]]) -> list[tuple[Any, str | None, bool]]:
    return [
        (o.value, None if o.error is None else repr(o.error), o.wrote) for o in store.execute(jobs)
    ]


def stored_ids(path: Path) -> set[str]:
    """The ids of the promises a SQLite file holds, read on a connection of its own."""
    conn = sqlite3.connect(path)
    try:
        return {row[0] for row in conn.execute("SELECT id FROM promises")}
    finally:
        conn.close()


def outbox_rows(db: Path, key: str) -> list[tuple[object, ...]]:
    """``(state, last_code, attempts)`` of every outbox row of ``key`` in a SQLite file,
    oldest first, read on a connection of its own."""
    conn = sqlite3.connect(db, timeout=10)
    try:
        sql = "SELECT state, last_code, attempts FROM outbox WHERE key = ? ORDER BY id"
        return [tuple(r) for r in conn.execute(sql, (key,)).fetchall()]
    finally:
        conn.close()


class CommitSpy(SqliteStore):
    """A real SQLite store that records on which thread each COMMIT ran, and can be made
    to fail the next ``fail_commits`` of them (a failed COMMIT cannot be provoked on a
    healthy file)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.commit_threads: list[int] = []
        self.fail_commits = 0

    def commit(self) -> None:
        self.commit_threads.append(threading.get_ident())
        if self.fail_commits:
            self.fail_commits -= 1
            raise sqlite3.OperationalError("disk I/O error (injected)")
        super().commit()
