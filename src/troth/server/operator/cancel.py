"""Cancel a workflow: every pending promise of its tree settled ``rejected_canceled``.

A workflow is a tree of promises: its root, and every promise tagged
``resonate:origin`` = the root's id.  Cancelling it is nothing the machine does not
already do — ordinary ``promise.settle`` steps, run by the machine in the engine's
transactions — so a cancelled promise fulfils its task, its listeners get their
``unblock`` and its callbacks wake their awaiters exactly as for any settle, and a
worker that still holds one of the tree's tasks is refused at its next fence,
heartbeat or fulfil (the task's promise is no longer pending).

Why it is shaped as it is:

* **Oldest first.**  A promise is always created after the promise whose task
  created it, so creation order puts every parent before its children.  Settling in
  that order means a child's settle never resumes a parent that is still pending
  (its callback would wake the parent's task and a worker would run a further step
  of a workflow being cancelled); the root goes first.
* **Bounded transactions.**  :data:`CHUNK` settles per job: a tree of thousands
  never holds the writer (or PostgreSQL's row locks) for long, and requests of other
  workflows interleave with it.
* **Resumable and idempotent.**  Only what is still pending is settled, found anew
  on each pass; a second call after a crash finishes the rest, and one on a tree
  already cancelled changes nothing.  Passes repeat until one finds nothing pending
  (a worker that was running while the first pass went by may have created children
  it did not see), up to :data:`PASSES`.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from troth.engine import Engine
from troth.machine.core import handle, lock_keys
from troth.machine.internal import Config
from troth.protocol import requests as rq
from troth.protocol.records import PENDING, REJECTED_CANCELED, Value
from troth.store.base import Overlay
from troth.store.inspection import Inspection

#: Promises settled in one transaction.
CHUNK: Final = 200
#: Ids one read of the tree's index brings.
WINDOW: Final = 1000
#: Passes over the tree before giving up on a workflow that keeps growing.
PASSES: Final = 5
#: Ids a cancel's answer names (the first it settled).
FIRST: Final = 20
#: Longest reason kept in the cancelled promises' value.
MAX_REASON: Final = 1000


@dataclass
class Cancelled:
    """What one cancel did: promises it settled, those it found settled meanwhile
    (by a worker or a timeout between the read and the settle), and whether the
    tree was found at all."""

    id: str
    found: bool = False
    canceled: int = 0
    settled_meanwhile: int = 0
    passes: int = 0
    pending_left: int = 0
    first: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "canceled": self.canceled,
            "settledMeanwhile": self.settled_meanwhile,
            "passes": self.passes,
            "pendingLeft": self.pending_left,
            "first": self.first,
        }


def reason_value(reason: str | None) -> Value:
    """The value a cancelled promise carries: ``{"reason": …}`` as JSON, base64 as
    the SDKs encode data, and a header that says an operator cancelled it."""
    body: dict[str, str] = {"reason": (reason or "canceled by an operator")[:MAX_REASON]}
    data = base64.b64encode(json.dumps(body).encode()).decode()
    return Value(headers={"troth:canceled": "operator"}, data=data)


def pending_of_tree(ins: Inspection, root: str) -> tuple[bool, list[str]]:
    """Whether ``root`` exists, and the ids of its tree still stored pending, oldest
    first (creation order, ties by id)."""
    root_promise = ins.promise(root)
    ids: list[str] = []
    after: str | None = None
    while True:
        rows = ins.window("", root, after, WINDOW)
        ids += [id for id, state, _ in rows if state == PENDING and id != root]
        if len(rows) < WINDOW:
            break
        after = rows[-1][0]
    promises = ins.promises_of(ids)
    promises.sort(key=lambda p: (p.created_at, p.id))
    ordered = [p.id for p in promises if p.state == PENDING]
    if root_promise is not None and root_promise.state == PENDING:
        ordered.insert(0, root)
    return root_promise is not None, ordered


def settle_job(
    ids: Sequence[str],
    value: Value,
    now: int,
    config: Config,
    keep_limits: Callable[[Overlay, int], None] | None = None,
) -> Callable[[Overlay], tuple[int, int]]:
    """One transaction's settles: ``(settled by it, found settled already)``.  The
    machine answers each as it answers a client's ``promise.settle``; then the slots
    of the tasks it ended are freed (``keep_limits``: the engine's, flow control)."""

    def job(tx: Overlay) -> tuple[int, int]:
        settled = meanwhile = 0
        for id in ids:
            req = rq.PromiseSettle(id=id, state=REJECTED_CANCELED, value=value)
            response = handle(tx, req, now, config, {})
            if response.status != 200 or not isinstance(response.data, dict):
                continue
            record = response.data["promise"]
            if record.state == REJECTED_CANCELED and record.settled_at == now:
                settled += 1
            else:
                meanwhile += 1
        if keep_limits is not None:
            keep_limits(tx, now)
        return settled, meanwhile

    return job


def chunk_keys(ids: Sequence[str]) -> tuple[str, ...]:
    """The lock keys of a chunk's settles, sorted (a store shared between nodes
    locks them in that order up front)."""
    keys: set[str] = set()
    for id in ids:
        keys.update(lock_keys(rq.PromiseSettle(id=id, state=REJECTED_CANCELED)))
    return tuple(sorted(keys))


async def cancel_workflow(engine: Engine, root: str, reason: str | None) -> Cancelled:
    """Cancel the workflow rooted at ``root`` (see the module's docstring)."""
    result = Cancelled(root)
    value = reason_value(reason)
    for _ in range(PASSES + 1):
        found, ids = await asyncio.to_thread(
            engine.store.inspect, lambda ins: pending_of_tree(ins, root)
        )
        result.found = result.found or found or bool(ids)
        result.pending_left = len(ids)
        if not ids or result.passes == PASSES:
            break
        result.passes += 1
        for at in range(0, len(ids), CHUNK):
            chunk = ids[at : at + CHUNK]
            now = engine.clock()
            keys = chunk_keys(chunk) if engine.store.uses_keys else ()
            settled, meanwhile = await engine.run(
                settle_job(chunk, value, now, engine.config, engine.keep_limits),
                now,
                keys,
                settles=keys,
            )
            result.canceled += settled
            result.settled_meanwhile += meanwhile
            room = FIRST - len(result.first)
            if room > 0:
                result.first += list(chunk[:room])
    return result
