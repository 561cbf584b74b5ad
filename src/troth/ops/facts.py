"""What ``explain`` reasons from, read in one snapshot of the store.

:func:`gather` runs inside ``Store.inspect`` (one read transaction, no locks): the
promise asked about, its workflow (every promise with the same ``resonate:origin``,
an index read), the task of every pending promise, the newest outbox rows of each
such task, and for a pending task held by its group's concurrency limit (troth/flow)
that limit's use and the tasks queued before it.  Reading them together is what lets
the explanation relate a task to the executes written for it without a write racing
in between.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from troth.outbox.rows import OutboxRow
from troth.protocol.records import TAG_ORIGIN, Promise, Schedule, Task, TaskState
from troth.store.inspection import TREE_LIMIT, Inspection

#: Outbox rows read per task (the count says "at least" past it).
DELIVERIES_PER_TASK: Final = 50
#: Pending promises whose task and deliveries are read (a bigger workflow is cut).
MAX_PENDING: Final = 500


@dataclass(frozen=True)
class HeldFact:
    """A pending task queued for a slot of its group (troth/flow): the limit, the
    slots in use, and the tasks queued before it (its place in the queue)."""

    group: str
    concurrency: int | None
    in_use: int
    ahead: int
    priority: int
    #: The group's rate (starts per second), when it has one.
    rate: float | None = None
    #: The task's ``troth:key`` with its slots in use, and the group's ``per_key``.
    key: str = ""
    key_in_use: int = 0
    per_key: int | None = None


@dataclass
class Facts:
    id: str
    promises: dict[str, Promise] = field(default_factory=dict)
    tasks: dict[str, Task] = field(default_factory=dict)
    deliveries: dict[str, list[OutboxRow]] = field(default_factory=dict)
    schedule: Schedule | None = None
    #: Pending tasks held by their group's concurrency limit, by id.
    held: dict[str, HeldFact] = field(default_factory=dict)
    #: The workflow was larger than what was read.
    cut: bool = False

    @property
    def promise(self) -> Promise | None:
        return self.promises.get(self.id)


def gather(ins: Inspection, id: str) -> Facts:
    """Everything ``explain`` needs about ``id``, from one snapshot."""
    facts = Facts(id)
    root = ins.promise(id)
    if root is None:
        facts.schedule = ins.schedule(id)
        return facts
    facts.promises[id] = root
    origin = root.tags.get(TAG_ORIGIN, id)
    tree = ins.tree(origin)
    if origin != id and not any(p.id == id for p in tree):
        tree.append(root)
    facts.promises.update((p.id, p) for p in tree)
    # A promise awaited from outside its tree (a ctx.promise of another origin, a
    # promise created by a client) is not found by origin; the root's own subtree is
    # what the explanation walks, so only this workflow's promises are read.
    facts.cut = len(tree) >= TREE_LIMIT
    pending = [p for p in facts.promises.values() if p.pending][:MAX_PENDING]
    facts.cut = facts.cut or len(pending) == MAX_PENDING
    tasks = ins.tasks([p.id for p in pending])  # one read, not one per promise
    for p in pending:
        if p.id in tasks:
            facts.tasks[p.id] = tasks[p.id]
            facts.deliveries[p.id] = ins.deliveries(p.id, DELIVERIES_PER_TASK)
    # A settled root may still have a task worth showing (fulfilled, or not).
    if id not in facts.tasks:
        task = ins.task(id)
        if task is not None:
            facts.tasks[id] = task
            facts.deliveries[id] = ins.deliveries(id, DELIVERIES_PER_TASK)
    _held(ins, facts)
    return facts


def _held(ins: Inspection, facts: Facts) -> None:
    """The pending tasks queued for a slot (one read; none where no limit holds any),
    each with its limit's use and its place in the queue."""
    waiting = [t.id for t in facts.tasks.values() if t.state == TaskState.PENDING]
    queued = ins.held(waiting) if waiting else {}
    if not queued:
        return
    limits = {u.group: u for u in ins.limits()}
    for id, h in queued.items():
        use = limits.get(h.group)
        if use is not None:
            ahead = ins.held_ahead(h)
            key_in_use = ins.key_in_use(h.group, h.key) if use.per_key is not None else 0
            facts.held[id] = HeldFact(
                h.group,
                use.concurrency,
                use.in_use,
                ahead,
                h.priority,
                use.rate,
                h.key,
                key_in_use,
                use.per_key,
            )
