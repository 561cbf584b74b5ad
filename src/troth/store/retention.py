"""Retention: deleting settled workflows, a whole tree at a time (docs/operations.md,
"Retention").

A *workflow* (a tree) is a root promise — one without ``resonate:origin``, or whose
origin is itself — and every promise whose origin names it, with their tasks and
the outbox rows of those tasks.  A tree is deleted only when every one of its
promises has been settled for longer than the horizon, so a live workflow never
loses a child, and a tree is deleted in one transaction, so a request sees either
all of it or nothing.  Roots are read oldest-settled first through the partial
index ``promises_settled_roots`` (schema version 5), from a cursor, a batch at a
time: the caller (server/retention.py) bounds each batch and yields between them.

On PostgreSQL several nodes sweep at once: candidate roots and then their trees are
locked ``FOR UPDATE SKIP LOCKED``, so two nodes never take the same tree and a tree
any of whose rows a request holds is skipped (the next pass looks again) rather
than waited for.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from troth.protocol.records import PENDING, Promise, Task
from troth.store.codec import PROMISE_COLS, TASK_COLS, RowCodec
from troth.store.outbox import Cursor

#: Where a pass starts: before every ``(settled_at, id)``.
START: Final = (-1, "")


@dataclass
class Tree:
    """One workflow about to be deleted: what the archive keeps of it."""

    root: str
    promises: list[Promise]
    tasks: list[Task]

    def as_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "promises": [msgspec.to_builtins(p) for p in self.promises],
            "tasks": [msgspec.to_builtins(t) for t in self.tasks],
        }


@dataclass
class Swept:
    """What one batch did."""

    trees: int = 0
    promises: int = 0
    tasks: int = 0
    outbox: int = 0
    #: Candidate roots whose tree could not go yet (a promise pending or settled
    #: within the horizon, or a row held by a request).
    skipped: int = 0
    #: Where the next batch starts; None when this batch reached the end of the pass.
    cursor: tuple[int, str] | None = None
    #: How long past the horizon the oldest tree this batch deleted had waited (ms).
    behind_ms: int = 0
    deleted: list[str] = field(default_factory=list)


Archive = Callable[[Sequence[Tree]], None]


def settled_at(p: Promise) -> int:
    """When a settled promise settled (a timed-out one without the field: its timeout)."""
    return p.settled_at if p.settled_at is not None else p.timeout_at


def deletable(tree: Sequence[Promise], cutoff: int) -> bool:
    return bool(tree) and all(p.state != PENDING and settled_at(p) < cutoff for p in tree)


class Retention(ABC):
    """One transaction's retention work; what each store implements."""

    @abstractmethod
    def candidates(self, cutoff: int, after: tuple[int, str], limit: int) -> list[tuple[int, str]]:
        """Settled roots ``(settled_at, id)`` older than ``cutoff``, after ``after``."""

    @abstractmethod
    def tree(self, root: str) -> tuple[list[Promise], list[Task]] | None:
        """The tree's promises and tasks (locked where rows lock), or None when another
        transaction holds one of its rows."""

    @abstractmethod
    def delete(self, tree: Tree) -> tuple[int, int, int]:
        """Delete exactly the rows read into ``tree`` (a promise created since is not
        one of them): ``(promises, tasks, outbox rows)`` deleted.  Outbox rows being
        sent right now (``dispatching``) stay: their settlement finds them, and the
        outbox's own retention purges them."""

    def sweep(
        self, cutoff: int, after: tuple[int, str], limit: int, archive: Archive | None
    ) -> Swept:
        """One batch: up to ``limit`` candidate roots, each tree deleted if it may be.
        ``archive`` sees the trees before they are deleted (in the same transaction:
        if it raises, nothing is deleted)."""
        found = self.candidates(cutoff, after, limit)
        out = Swept(cursor=found[-1] if len(found) == limit else None)
        trees: list[Tree] = []
        for at, root in found:
            read = self.tree(root)
            if read is None or not deletable(read[0], cutoff):
                out.skipped += 1
                continue
            trees.append(Tree(root, *read))
            out.behind_ms = max(out.behind_ms, cutoff - at)
        if trees and archive is not None:
            archive(trees)
        for tree in trees:
            promises, tasks, rows = self.delete(tree)
            out.trees += 1
            out.promises += promises
            out.tasks += tasks
            out.outbox += rows
            out.deleted.append(tree.root)
        return out


class SqlRetention(Retention):
    """:class:`Retention` in the SQL both dialects share; ``mark`` is the placeholder
    and ``lock`` the locking clause (PostgreSQL's ``FOR UPDATE SKIP LOCKED``)."""

    def __init__(self, cur: Cursor, codec: RowCodec, mark: str, lock: str = "") -> None:
        self.cur = cur
        self.codec = codec
        self.lock = lock
        self.mark = mark
        self.q = _queries(mark, lock)

    def _rows(self, name: str, *params: Any) -> list[Sequence[Any]]:
        rows: list[Sequence[Any]] = self.cur.execute(self.q[name], params).fetchall()
        return rows

    def _count(self, name: str, *params: Any) -> int:
        found = self.cur.execute(self.q[name], params).fetchone()
        return int(found[0]) if found is not None else 0

    def candidates(self, cutoff: int, after: tuple[int, str], limit: int) -> list[tuple[int, str]]:
        i = self.codec.int_in
        at, id = after
        rows = self._rows("candidates", i(cutoff), i(at), i(at), id, limit)
        return [(int(self.codec.int_out(r[0]) or 0), str(r[1])) for r in rows]

    def tree(self, root: str) -> tuple[list[Promise], list[Task]] | None:
        promises = [self.codec.promise(r) for r in self._rows("tree", root, root)]
        tasks = [self.codec.task(r) for r in self._rows("tree_tasks", root, root)]
        if self.lock:
            # Rows a request holds were skipped: the tree is not whole, leave it.
            if len(promises) != self._count("tree_size", root, root):
                return None
            if len(tasks) != self._count("tree_tasks_size", root, root):
                return None
        return promises, tasks

    def delete(self, tree: Tree) -> tuple[int, int, int]:
        promise_ids = [p.id for p in tree.promises]
        task_ids = [t.id for t in tree.tasks]
        rows = tasks = promises = 0
        for chunk in _chunks(task_ids):
            marks = ", ".join([self.mark] * len(chunk))
            rows += int(
                self.cur.execute(
                    f"DELETE FROM outbox WHERE task_id IN ({marks}) AND state <> 'dispatching'",
                    chunk,
                ).rowcount
            )
            tasks += int(
                self.cur.execute(f"DELETE FROM tasks WHERE id IN ({marks})", chunk).rowcount
            )
        for chunk in _chunks(promise_ids):
            marks = ", ".join([self.mark] * len(chunk))
            promises += int(
                self.cur.execute(f"DELETE FROM promises WHERE id IN ({marks})", chunk).rowcount
            )
        return promises, tasks, rows


def _chunks(ids: list[str], size: int = 500) -> list[list[str]]:
    return [ids[k : k + size] for k in range(0, len(ids), size)]


def _queries(p: str, lock: str) -> dict[str, str]:
    members = f"(origin = {p} OR id = {p})"
    ids = f"(SELECT id FROM promises WHERE {members})"
    return {
        # The index's own predicate, literally, so that both planners take it.
        "candidates": (
            "SELECT settled_at, id FROM promises"
            " WHERE state <> 'pending' AND (origin IS NULL OR origin = id)"
            f" AND settled_at < {p} AND (settled_at > {p} OR (settled_at = {p} AND id > {p}))"
            f" ORDER BY settled_at, id LIMIT {p} {lock}"
        ),
        "tree": f"SELECT {PROMISE_COLS} FROM promises WHERE {members} ORDER BY id {lock}",
        "tree_size": f"SELECT count(*) FROM promises WHERE {members}",
        "tree_tasks": f"SELECT {TASK_COLS} FROM tasks WHERE id IN {ids} ORDER BY id {lock}",
        "tree_tasks_size": f"SELECT count(*) FROM tasks WHERE id IN {ids}",
    }
