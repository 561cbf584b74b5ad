"""Retention: deleting settled workflows, a whole tree at a time (docs/operations.md,
"Retention").

A *workflow* (a tree) is a root promise — one without ``resonate:origin``, or whose
origin is itself — and every promise whose origin names it, with their tasks and
the outbox rows of those tasks.  A tree is deleted only when every one of its
promises has been settled for longer than the horizon, so a live workflow never
loses a child, and a tree is deleted in one transaction, so a request sees either
all of it or nothing.  Roots are read oldest-settled first through the partial
index ``promises_settled_roots`` (schema version 5), from a cursor, a batch at a
time: the caller (server/operator/retention.py) bounds each batch and yields between them.

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

from troth.protocol.records import PENDING, TAG_ORIGIN, Promise, Task
from troth.store.outbox import Cursor
from troth.store.sql.codec import PROMISE_COLS, TASK_COLS, RowCodec

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

    def sweep(
        self, cutoff: int, after: tuple[int, str], limit: int, archive: Archive | None
    ) -> Swept:
        """:meth:`Retention.sweep` in a few statements for the whole batch rather than
        five per tree: every candidate's members read at once (only the columns the
        rule needs, unless an archive wants whole rows), then deleted at once.  Same
        outcome: a tree goes whole or stays whole, in this one transaction."""
        found = self.candidates(cutoff, after, limit)
        out = Swept(cursor=found[-1] if len(found) == limit else None)
        if not found:
            return out
        members = self._members([id for _, id in found])
        if members is None:
            return out
        keep: list[tuple[int, str]] = []
        for at, root in found:
            tree = members.get(root)
            if not tree or not all(
                state != PENDING and when < cutoff for _, state, when, _task in tree
            ):
                out.skipped += 1
                continue
            keep.append((at, root))
            out.behind_ms = max(out.behind_ms, cutoff - at)
        if not keep:
            return out
        promise_ids = [m[0] for _, root in keep for m in members[root]]
        task_ids = [m[0] for _, root in keep for m in members[root] if m[3]]
        if archive is not None:
            archive(self._trees([root for _, root in keep], promise_ids, task_ids))
        rows, tasks, promises = self._delete(promise_ids, task_ids)
        out.trees, out.promises, out.tasks, out.outbox = len(keep), promises, tasks, rows
        out.deleted = [root for _, root in keep]
        return out

    def _members(self, roots: list[str]) -> dict[str, list[tuple[str, str, int, bool]]] | None:
        """``root → [(id, state, settled at, has a task)]`` of every candidate's tree;
        a tree some of whose rows another transaction holds (skip-locked) is left
        out, as is every tree when rows lock and the reads disagree."""
        out: dict[str, list[tuple[str, str, int, bool]]] = {}
        o = self.codec.int_out
        for chunk in _chunks(roots):
            marks = ", ".join([self.mark] * len(chunk))
            where = f"(origin IN ({marks}) OR id IN ({marks}))"
            rows = self.cur.execute(
                "SELECT p.id, coalesce(p.origin, p.id), p.state, p.settled_at, p.timeout_at,"
                " t.id IS NOT NULL FROM promises AS p LEFT JOIN tasks AS t ON t.id = p.id"
                f" WHERE (p.origin IN ({marks}) OR p.id IN ({marks})) ORDER BY p.id",
                [*chunk, *chunk],
            ).fetchall()
            for id, root, state, settled, timeout, task in rows:
                when = o(settled) if settled is not None else o(timeout)
                out.setdefault(str(root), []).append((str(id), str(state), int(when), bool(task)))
            if self.lock:
                self._lock_or_drop(where, chunk, out)
        return out

    def _lock_or_drop(
        self, where: str, chunk: list[str], out: dict[str, list[tuple[str, str, int, bool]]]
    ) -> None:
        """Rows lock (PostgreSQL): lock the chunk's promises and tasks, skipping those
        a request holds; a tree that lost a row to the skip (or gained one since the
        read) is dropped from ``out``: the next pass looks at it again."""
        params = [*chunk, *chunk]
        locked = self.cur.execute(
            f"SELECT id, coalesce(origin, id) FROM promises WHERE {where} {self.lock}", params
        ).fetchall()
        have: dict[str, set[str]] = {}
        for id, root in locked:
            have.setdefault(str(root), set()).add(str(id))
        ids = [m[0] for root in chunk for m in out.get(root, []) if m[3]]
        held: set[str] = set()
        for part in _chunks(ids):
            marks = ", ".join([self.mark] * len(part))
            held |= {
                str(r[0])
                for r in self.cur.execute(
                    f"SELECT id FROM tasks WHERE id IN ({marks}) {self.lock}", part
                ).fetchall()
            }
        for root in chunk:
            tree = out.get(root)
            if tree is None:
                continue
            if {m[0] for m in tree} != have.get(root, set()) or any(
                m[3] and m[0] not in held for m in tree
            ):
                del out[root]

    def _trees(self, roots: list[str], promise_ids: list[str], task_ids: list[str]) -> list[Tree]:
        """Whole rows of the trees about to go, for the archive."""
        promises: dict[str, list[Promise]] = {r: [] for r in roots}
        tasks: dict[str, list[Task]] = {r: [] for r in roots}
        root_of: dict[str, str] = {}
        for part in _chunks(promise_ids):
            marks = ", ".join([self.mark] * len(part))
            sql = f"SELECT {PROMISE_COLS} FROM promises WHERE id IN ({marks}) ORDER BY id"
            for r in self.cur.execute(sql, part).fetchall():
                p = self.codec.promise(r)
                root = p.tags.get(TAG_ORIGIN) or p.id
                root_of[p.id] = root
                promises[root].append(p)
        for part in _chunks(task_ids):
            marks = ", ".join([self.mark] * len(part))
            sql = f"SELECT {TASK_COLS} FROM tasks WHERE id IN ({marks}) ORDER BY id"
            for r in self.cur.execute(sql, part).fetchall():
                t = self.codec.task(r)
                tasks[root_of[t.id]].append(t)
        return [
            Tree(root, sorted(promises[root], key=lambda p: p.id), tasks[root]) for root in roots
        ]

    def _delete(self, promise_ids: list[str], task_ids: list[str]) -> tuple[int, int, int]:
        """``(outbox rows, tasks, promises)`` deleted, a chunk of ids per statement."""
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
        return rows, tasks, promises

    def delete(self, tree: Tree) -> tuple[int, int, int]:
        rows, tasks, promises = self._delete(
            [p.id for p in tree.promises], [t.id for t in tree.tasks]
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
