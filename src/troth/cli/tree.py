"""``troth tree ID``: a workflow's call graph, from the server's answers alone.

The promises of a workflow carry ``resonate:origin`` (its root) and
``resonate:parent`` (who made them), as both published SDKs tag them; one search by
origin brings the whole tree, and ``task.get`` adds the task of each promise that
has one (those with a ``resonate:target``).  Long runs of settled siblings fold into
one line with counts, so wide trees stay readable; ``--all`` unfolds them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final, TextIO

from troth.cli.remote import Remote, RemoteError
from troth.cli.render import Renderer, paint
from troth.ops.explain import function_in
from troth.ops.times import relative
from troth.plural import counted
from troth.protocol.records import TAG_ORIGIN, TAG_PARENT, TAG_TARGET

#: Settled siblings in a row beyond which the middle ones fold into one line.
FOLD_AFTER: Final = 6
PAGE: Final = 1000


@dataclass
class Node:
    promise: dict[str, Any]
    task: dict[str, Any] | None = None
    children: list[Node] = field(default_factory=list)

    @property
    def id(self) -> str:
        return str(self.promise.get("id"))

    @property
    def state(self) -> str:
        return str(self.promise.get("state"))

    def settled_below(self) -> bool:
        """Settled, and so is everything it made."""
        return self.state != "pending" and all(c.settled_below() for c in self.children)

    def as_json(self) -> dict[str, Any]:
        return {
            "promise": self.promise,
            "task": self.task,
            "children": [c.as_json() for c in self.children],
        }


def function_of(p: dict[str, Any]) -> str | None:
    """The function name an SDK put in the param (base64 JSON ``{"func": …}``)."""
    data = (p.get("param") or {}).get("data")
    return function_in(data) if isinstance(data, str) else None


def fetch(remote: Remote, root: str) -> Node:
    """The tree under ``root``: its promises by origin, linked by parent, with tasks."""
    top = remote.ok("promise.get", {"id": root})["promise"]
    found: dict[str, dict[str, Any]] = {root: top}
    cursor: str | None = None
    while True:
        query: dict[str, Any] = {"tags": {TAG_ORIGIN: root}, "limit": PAGE}
        if cursor:
            query["cursor"] = cursor
        page = remote.ok("promise.search", query)
        for p in page.get("promises", []):
            found[str(p["id"])] = p
        cursor = page.get("cursor")
        if not cursor:
            break
    nodes = {id: Node(p) for id, p in found.items()}
    for id, node in nodes.items():
        parent = (node.promise.get("tags") or {}).get(TAG_PARENT)
        if id != root and parent in nodes and parent != id:
            nodes[parent].children.append(node)
        elif id != root:
            nodes[root].children.append(node)  # lineage lost: show it under the root
    for node in nodes.values():
        node.children.sort(key=lambda n: (n.promise.get("createdAt", 0), n.id))
        if TAG_TARGET in (node.promise.get("tags") or {}) or node.id == root:
            try:
                node.task = remote.ok("task.get", {"id": node.id}).get("task")
            except RemoteError as exc:
                if exc.status != 404:
                    raise
    return nodes[root]


def describe(node: Node, r: Renderer) -> str:
    p = node.promise
    tags = p.get("tags") or {}
    state = node.state
    since = p.get("settledAt") if state != "pending" else p.get("createdAt")
    parts = [node.id, r.state(state)]
    if isinstance(since, int):
        parts.append(("since " if state == "pending" else "") + relative(since, r.now))
    func = function_of(p)
    if tags.get("resonate:timer") == "true":
        parts.append(f"sleep until {relative(int(p.get('timeoutAt', 0)), r.now)}")
    elif tags.get("resonate:scope") == "local":
        parts.append(f"run {func}" if func else "run")
    elif func:
        parts.append(f"rpc {func}" if node.promise.get("id") != tags.get(TAG_ORIGIN) else func)
    if node.task is not None:
        t = node.task
        task = f"task {r.state(str(t.get('state')))} v{t.get('version')}"
        if t.get("pid"):
            task += f" pid {t['pid']}"
        parts.append(task)
    return "  ".join(parts)


def draw(node: Node, r: Renderer, out: TextIO, *, unfold: bool) -> None:
    print(describe(node, r), file=out)
    _children(node, r, out, "", unfold)


def _children(node: Node, r: Renderer, out: TextIO, prefix: str, unfold: bool) -> None:
    items: list[Node | list[Node]] = []
    run: list[Node] = []
    for child in node.children:
        if child.settled_below() and not unfold:
            run.append(child)
            continue
        items += _fold(run)
        run = []
        items.append(child)
    items += _fold(run)
    for i, item in enumerate(items):
        last = i == len(items) - 1
        branch, below = ("└── ", "    ") if last else ("├── ", "│   ")
        if isinstance(item, list):
            counts = Counter(n.state for n in item)
            states = ", ".join(f"{n} {paint(s, s, r.colour)}" for s, n in sorted(counts.items()))
            print(f"{prefix}{branch}… {len(item)} more settled ({states})", file=out)
            continue
        print(f"{prefix}{branch}{describe(item, r)}", file=out)
        _children(item, r, out, prefix + below, unfold)


def _fold(run: list[Node]) -> list[Node | list[Node]]:
    """A run of settled siblings: all of it when short; else first two, a count, last."""
    if len(run) <= FOLD_AFTER:
        return list(run)
    return [run[0], run[1], run[2:-1], run[-1]]


def count(node: Node) -> Counter[str]:
    total: Counter[str] = Counter({node.state: 1})
    for child in node.children:
        total += count(child)
    return total


def show_tree(remote: Remote, root: str, r: Renderer, *, unfold: bool) -> None:
    tree = fetch(remote, root)
    if r.as_json:
        r.json(tree.as_json())
        return
    draw(tree, r, r.out, unfold=unfold)
    totals = count(tree)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(totals.items()))
    print(f"({counted(sum(totals.values()), 'promise')}: {summary})", file=r.out)
