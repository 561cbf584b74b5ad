"""The dispatcher's safety contract (seed 000), against every store backend.

Rows are written the way the server writes them (``set_message`` inside a store
transaction) and the dispatcher works through the production adapter
(``LifecycleCalls``: the store's lifecycle, called on the engine's writer thread
or, for PostgreSQL, on a thread of its own).  Senders and reconcilers are test
doubles: they stand for the remote system, whose faults cannot be produced otherwise.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from helpers import pg
from troth.engine import Engine
from troth.machine.internal import Config
from troth.outbox import codes
from troth.outbox import dispatcher as dispatcher_module
from troth.outbox.dispatcher import OutboxDispatcher
from troth.outbox.rows import OutboxRow, RowState, Settlement
from troth.outbox.types import (
    Completed,
    DispatchConfig,
    Dispatched,
    Failed,
    Permanent,
    Reconciled,
    Resend,
    Retryable,
    Unknown,
)
from troth.protocol.records import Execute, PromiseRecord, Unblock, Value
from troth.server.delivery.loop import LifecycleCalls
from troth.store.base import Job, Store
from troth.store.memory import MemoryStore

NOW = 1_000_000


def make_sqlite(path: Path) -> Store:
    from troth.store.sqlite import SqliteStore

    return SqliteStore(str(path / "d.db"))


STORES: dict[str, Callable[[Path], Store]] = {
    "memory": lambda _: MemoryStore(),
    "sqlite": make_sqlite,
}


@pytest.fixture(params=sorted([*STORES, "postgres"]))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "postgres":
        s: Store = pg.fresh_store(request.getfixturevalue("pg_url"))
    else:
        s = STORES[request.param](tmp_path)
    yield s
    s.close()


def write(store: Store, *entries: tuple[str, Any], now: int = NOW) -> None:
    def job(tx: Any) -> None:
        for address, message in entries:
            tx.set_message(address, message)

    [outcome] = store.execute([Job(job, now)])
    assert outcome.error is None


def execute(task: str, version: int = 0) -> tuple[str, Execute]:
    return ("poll://any@g", Execute(task_id=task, version=version))


def unblock(promise: str, address: str = "poll://uni@g/w") -> tuple[str, Unblock]:
    record = PromiseRecord(
        id=promise,
        state="resolved",
        param=Value(),
        value=Value(),
        tags={},
        timeout_at=NOW + 10,
        created_at=NOW - 10,
        settled_at=NOW,
    )
    return (address, Unblock(record))


@dataclass
class Recorder:
    """A sender that records every row it was handed and answers with ``answer``."""

    answer: Callable[[OutboxRow], Awaitable[Dispatched]] | None = None
    sent: list[OutboxRow] = field(default_factory=list)

    async def send(self, row: OutboxRow) -> Dispatched:
        self.sent.append(row)
        if self.answer is None:
            return Completed()
        return await self.answer(row)


def run(store: Store, body: Callable[[Engine, LifecycleCalls], Awaitable[None]]) -> None:
    async def main() -> None:
        engine = Engine(store, Config(), clock=lambda: NOW)
        await engine.start()
        try:
            await body(engine, LifecycleCalls(engine))
        finally:
            engine.store = _Unclosable(store)  # type: ignore[assignment]
            await engine.stop()

    asyncio.run(main())


def dispatcher(rows: LifecycleCalls, *args: Any, **kwargs: Any) -> OutboxDispatcher:
    """A dispatcher wired as the server wires it."""
    return OutboxDispatcher(rows.life, *args, run=rows, **kwargs)


async def claim(rows: LifecycleCalls, worker: str = "w") -> list[OutboxRow]:
    return await rows(lambda: rows.life.claim_due(worker, NOW, 10, "tok"))


async def settle(
    rows: LifecycleCalls,
    row: OutboxRow,
    state: RowState,
    code: str | None = None,
    at: int | None = None,
) -> bool:
    item = Settlement(row.id, row.claim_token, state, NOW, code, at)
    [ok] = await rows(lambda: rows.life.settle([item]))
    return ok


class _Unclosable:
    """Lets the fixture, not the engine, close the store.  Everything else goes to the
    store: the engine's timer may still be in a pass when the engine is stopped, and
    reads the store's attributes as it ends it."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def close(self) -> None:
        pass


def rows_by_state(store: Store) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for row in store.snapshot()["outbox"]:
        out.setdefault(row["state"], []).append(row["key"])
    return out


# ---------------------------------------------------------------- the five properties


def test_two_dispatchers_never_send_the_same_row(store: Store) -> None:
    write(store, *(execute(f"t{i}") for i in range(60)))
    a, b = Recorder(), Recorder()

    async def body(engine: Engine, rows: LifecycleCalls) -> None:
        da = dispatcher(rows, a, DispatchConfig(worker_id="a", batch_size=7))
        db = dispatcher(rows, b, DispatchConfig(worker_id="b", batch_size=7))
        for _ in range(10):
            await asyncio.gather(da.run_once(NOW), db.run_once(NOW))

    run(store, body)
    keys = [r.key for r in a.sent + b.sent]
    assert sorted(keys) == sorted(f"t{i}" for i in range(60))  # each exactly once
    assert a.sent and b.sent
    states = rows_by_state(store)
    assert list(states) == ["completed"]
    assert sorted(states["completed"]) == sorted(keys)


def test_a_hanging_send_becomes_unknown_and_is_not_retried(store: Store) -> None:
    write(store, execute("t"))

    async def hang(row: OutboxRow) -> Dispatched:
        await asyncio.sleep(3600)
        return Completed()

    sender = Recorder(hang)

    async def body(engine: Engine, rows: LifecycleCalls) -> None:
        d = dispatcher(rows, sender, DispatchConfig(send_timeout=0.05, claim_timeout=60))
        first = await d.run_once(NOW)
        assert (first.claimed, first.unknown, first.retried) == (1, 1, 0)
        second = await d.run_once(NOW + 3_600_000)
        assert second.claimed == 0

    run(store, body)
    assert len(sender.sent) == 1
    [row] = store.snapshot()["outbox"]
    assert row["state"] == "outcome_unknown"


def test_unknown_is_settled_by_reconciliation_which_never_sends(store: Store) -> None:
    write(store, execute("t1"), execute("t2"), execute("t3"))
    sender = Recorder(lambda row: _const(Unknown()))
    verdicts: dict[str, Reconciled] = {
        "t1": Completed(),
        "t2": Failed("remote.said.no"),
        "t3": _Unresolved(),
    }

    class Reconciler:
        async def reconcile(self, row: OutboxRow) -> Reconciled:
            return verdicts[row.key]

    async def body(engine: Engine, rows: LifecycleCalls) -> None:
        d = dispatcher(rows, sender, DispatchConfig(), Reconciler())
        assert (await d.run_once(NOW)).unknown == 3
        report = await d.reconcile(NOW)
        assert (report.completed, report.failed, report.unresolved) == (1, 1, 1)

    run(store, body)
    assert len(sender.sent) == 3  # reconciliation sent nothing more
    states = {r["key"]: r["state"] for r in store.snapshot()["outbox"]}
    assert states == {"t1": "completed", "t2": "failed", "t3": "outcome_unknown"}


def test_a_settled_row_is_never_sent_again(store: Store) -> None:
    write(store, execute("t"), unblock("p"))
    sender = Recorder()

    async def body(engine: Engine, rows: LifecycleCalls) -> None:
        d = dispatcher(rows, sender, DispatchConfig())
        assert (await d.run_once(NOW)).completed == 2
        for later in (NOW, NOW + 1000, NOW + 10**9):
            assert (await d.run_once(later)).claimed == 0

    run(store, body)
    assert len(sender.sent) == 2


def test_retryable_waits_for_its_backoff_then_gives_up_with_a_stable_code(store: Store) -> None:
    write(store, execute("t"))
    sender = Recorder(lambda row: _const(Retryable("troth.poll.no_connection")))
    config = DispatchConfig(max_attempts=3, backoff_initial=1.0, backoff_factor=4.0)

    async def body(engine: Engine, rows: LifecycleCalls) -> None:
        d = dispatcher(rows, sender, config, clock=lambda: clock[0])
        clock = [NOW]
        assert (await d.run_once(NOW)).retried == 1  # attempt 1 failed: wait 1 s
        assert (await d.run_once(NOW + 999)).claimed == 0
        clock[0] = NOW + 1000
        assert (await d.run_once(NOW + 1000)).retried == 1  # attempt 2: wait 4 s
        assert (await d.run_once(NOW + 4999)).claimed == 0
        clock[0] = NOW + 5000
        assert (await d.run_once(NOW + 5000)).failed == 1  # attempt 3: exhausted

    run(store, body)
    assert len(sender.sent) == 3
    [row] = store.snapshot()["outbox"]
    assert row["state"] == "failed"
    assert row["attempts"] == 3
    assert row["lastCode"] == codes.ATTEMPTS_EXHAUSTED


# ----------------------------------------------------------------- the other paths


def test_permanent_fails_at_once(store: Store) -> None:
    write(store, execute("t"))
    sender = Recorder(lambda row: _const(Permanent("troth.http.status_404")))

    async def body(engine: Engine, rows: LifecycleCalls) -> None:
        d = dispatcher(rows, sender, DispatchConfig())
        assert (await d.run_once(NOW)).failed == 1
        assert (await d.run_once(NOW + 10**7)).claimed == 0

    run(store, body)
    assert rows_by_state(store) == {"failed": ["t"]}


def test_resend_queues_the_row_again(store: Store) -> None:
    write(store, execute("t"))
    answers = [Unknown(), Completed()]
    sender = Recorder(lambda row: _const(answers.pop(0)))

    class Again:
        async def reconcile(self, row: OutboxRow) -> Reconciled:
            return Resend()

    async def body(engine: Engine, rows: LifecycleCalls) -> None:
        d = dispatcher(rows, sender, DispatchConfig(), Again())
        assert (await d.run_once(NOW)).unknown == 1
        assert (await d.reconcile(NOW)).resent == 1
        assert (await d.run_once(NOW)).completed == 1

    run(store, body)
    assert len(sender.sent) == 2
    assert rows_by_state(store) == {"completed": ["t"]}


@dataclass
class ReaperSpy:
    """A lifecycle that records the reaper's passes: ``(cutoff, since)`` of each."""

    passes: list[tuple[int, int | None]] = field(default_factory=list)

    def release_expired_claims(
        self, cutoff: int, now: int, code: str, since: int | None = None
    ) -> int:
        self.passes.append((cutoff, since))
        return 0


async def inline(fn: Callable[[], Any]) -> Any:
    return fn()


def test_the_reaper_reads_the_claims_taken_since_its_last_cutoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first pass reads from the bottom, the next from the last cutoff less the
    overlap; after the wall clock steps back, and once a full pass is due, from the
    bottom again."""
    spy = ReaperSpy()
    config = DispatchConfig(send_timeout=30, claim_timeout=60)
    d = OutboxDispatcher(spy, Recorder(), config, run=inline)  # type: ignore[arg-type]

    async def passes() -> None:
        await d.release_expired_claims(NOW)
        await d.release_expired_claims(NOW + 6_000)
        await d.release_expired_claims(NOW - 3_600_000)  # the clock stepped back an hour
        await d.release_expired_claims(NOW - 3_594_000)
        monkeypatch.setattr(dispatcher_module, "FULL_REAP_EVERY", 0.0)
        await d.release_expired_claims(NOW - 3_588_000)

    asyncio.run(passes())
    overlap = dispatcher_module.REAP_OVERLAP
    cutoffs = [NOW - 60_000 + t for t in (0, 6_000, -3_600_000, -3_594_000, -3_588_000)]
    assert spy.passes == [
        (cutoffs[0], None),
        (cutoffs[1], cutoffs[0] - overlap),
        (cutoffs[2], None),
        (cutoffs[3], cutoffs[2] - overlap),
        (cutoffs[4], None),
    ]


def test_reaper_releases_old_claims_and_the_late_settlement_is_refused(store: Store) -> None:
    write(store, execute("t"))
    release = asyncio.Event

    async def body(engine: Engine, rows: LifecycleCalls) -> None:
        gate = release()

        async def slow(row: OutboxRow) -> Dispatched:
            await gate.wait()
            return Completed()

        sender = Recorder(slow)
        d = dispatcher(rows, sender, DispatchConfig(send_timeout=30, claim_timeout=60))
        sweep = asyncio.create_task(d.run_once(NOW))
        while not sender.sent:
            await asyncio.sleep(0.001)
        # Another process's reaper: the claim is older than the bound.
        reaped = await d.release_expired_claims(NOW + 61_000)
        assert reaped == 1
        gate.set()
        report = await sweep
        assert (report.completed, report.unsettled) == (0, 1)

    run(store, body)
    [row] = store.snapshot()["outbox"]
    assert row["state"] == "outcome_unknown"  # as the reaper left it


def test_settlement_is_fenced_by_the_claim_token(store: Store) -> None:
    write(store, execute("t"))

    async def body(engine: Engine, rows: LifecycleCalls) -> None:
        [claimed] = await claim(rows)
        forged = OutboxRow(**{**claimed.__dict__, "claim_token": "not-the-token"})
        assert await settle(rows, forged, RowState.COMPLETED) is False
        assert await settle(rows, forged, RowState.FAILED, "x") is False
        assert await settle(rows, forged, RowState.PENDING, "x", NOW) is False
        assert await settle(rows, forged, RowState.OUTCOME_UNKNOWN, "x") is False
        assert rows_by_state(store) == {"dispatching": ["t"]}
        assert await settle(rows, claimed, RowState.COMPLETED) is True
        assert await settle(rows, claimed, RowState.COMPLETED) is False  # settled once

    run(store, body)
    assert rows_by_state(store) == {"completed": ["t"]}


def test_a_newer_message_replaces_the_pending_row_but_never_a_claimed_one(store: Store) -> None:
    write(store, execute("t", 1))
    write(store, execute("t", 2))
    snap = store.snapshot()["outbox"]
    assert [(r["key"], r["message"]["version"], r["state"]) for r in snap] == [("t", 2, "pending")]

    async def body(engine: Engine, rows: LifecycleCalls) -> None:
        [claimed] = await claim(rows)
        assert claimed.message == Execute(task_id="t", version=2)
        write(store, execute("t", 3))
        # The claimed row is untouched; the newer message waits beside it.
        states = sorted((r["message"]["version"], r["state"]) for r in store.snapshot()["outbox"])
        assert states == [(2, "dispatching"), (3, "pending")]
        # A retry of the claimed row is superseded by the newer pending one.
        assert await settle(rows, claimed, RowState.PENDING, "x", NOW) is True

    run(store, body)
    pending = [r for r in store.snapshot()["outbox"] if r["state"] == "pending"]
    assert [r["message"]["version"] for r in pending] == [3]


def test_one_slow_remote_does_not_stall_the_sweep(store: Store) -> None:
    write(store, *(execute(f"t{i}") for i in range(10)))
    finished: list[tuple[str, float]] = []

    async def answer(row: OutboxRow) -> Dispatched:
        if row.key == "t0":
            await asyncio.sleep(0.5)
        finished.append((row.key, time.monotonic()))
        return Completed()

    sender = Recorder(answer)

    async def body(engine: Engine, rows: LifecycleCalls) -> None:
        d = dispatcher(rows, sender, DispatchConfig(concurrency=4))
        start = time.monotonic()
        report = await d.run_once(NOW)
        assert report.completed == 10
        fast = [t - start for k, t in finished if k != "t0"]
        assert max(fast) < 0.4  # all the others finished while t0 still hung

    run(store, body)


def test_the_row_carries_its_own_idempotency_key(store: Store) -> None:
    write(store, execute("task-9", 4), unblock("p1", "http://example.invalid/hook"))
    sender = Recorder()

    async def body(engine: Engine, rows: LifecycleCalls) -> None:
        await dispatcher(rows, sender, DispatchConfig()).run_once(NOW)

    run(store, body)
    assert sorted(r.key for r in sender.sent) == ["p1:notify:http://example.invalid/hook", "task-9"]


def test_completed_rows_are_purged_after_the_retention(store: Store) -> None:
    write(store, execute("t"))

    async def body(engine: Engine, rows: LifecycleCalls) -> None:
        d = dispatcher(rows, Recorder(), DispatchConfig(retention=10), clock=lambda: NOW)
        await d.run_once(NOW)
        assert await d.purge(NOW + 5_000) == 0
        assert await d.purge(NOW + 10_001) == 1

    run(store, body)
    assert store.snapshot()["outbox"] == []


async def _const(value: Any) -> Any:
    return value


def _Unresolved() -> Reconciled:
    from troth.outbox.types import Unresolved

    return Unresolved()
