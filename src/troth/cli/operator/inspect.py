"""``troth explain``, ``troth workers``, ``troth outbox``: troth's operator API
(``GET /ops/…``, server/operator/api.py) for people, or as JSON with ``--json``.

Unlike the protocol commands these need a troth server: the reasons, the outbox and
the worker connections are not part of the protocol.
"""

from __future__ import annotations

from typing import Any

from troth.cli.remote import Remote
from troth.cli.render import Renderer, table
from troth.ops.times import instant, relative
from troth.plural import counted


def show_explain(remote: Remote, id: str, r: Renderer) -> None:
    answer = remote.operator("explain", {"id": id})
    if r.as_json:
        r.json(answer)
        return
    _finding(answer["root"], r, "", True, top=True)
    blockers = answer.get("blockers") or []
    if answer.get("done"):
        print("(done)", file=r.out)
    elif blockers:
        reasons = sorted({b["reason"] for b in blockers})
        print(f"({counted(len(blockers), 'blocker')}: {', '.join(reasons)})", file=r.out)
    if answer.get("cut"):
        print("(the workflow is larger than one explanation reads; some branches may be missing)")


def _finding(f: dict[str, Any], r: Renderer, prefix: str, last: bool, *, top: bool = False) -> None:
    label = r.state(str(f.get("state")))
    func = f" {f['function']}" if f.get("function") else ""
    line = f"{f['id']}  {label}{func}: {f['text']}"
    if top:
        print(line, file=r.out)
        below = ""
    else:
        print(f"{prefix}{'└── ' if last else '├── '}{line}", file=r.out)
        below = prefix + ("    " if last else "│   ")
    children = f.get("awaiting") or []
    for i, child in enumerate(children):
        _finding(child, r, below, i == len(children) - 1)


def show_workers(remote: Remote, r: Renderer) -> None:
    answer = remote.operator("workers", {})
    if r.as_json:
        r.json(answer)
        return
    now = int(answer.get("now") or r.now)
    rows = []
    for g in answer["groups"]:
        conns = g["connections"]
        if not conns:
            seen = relative(g["lastSeen"], now) if g.get("lastSeen") else "never"
            rows.append([g["group"], "-", "-", f"none (last seen {seen})"])
        for c in conns:
            since = relative(c["since"], now) if c.get("since") else "-"
            rows.append([g["group"], c["pid"], c["node"], f"connected {since}"])
    if rows:
        table(["GROUP", "PID", "NODE", "STATE"], rows, r.out, r.plain)
    else:
        print("no worker has connected", file=r.out)
    nodes = answer.get("nodes") or []
    if nodes:
        print(file=r.out)
        table(
            ["NODE", "URL", "RELEASE", "SCHEMA", "STARTED", "HEARTBEAT", "ALIVE"],
            [
                [
                    n["node"],
                    n["url"],
                    n.get("release") or "older",
                    str(n.get("schema") or "-"),
                    relative(n["startedAt"], now),
                    relative(n["seenAt"], now),
                    "yes" if n["alive"] else "no",
                ]
                for n in nodes
            ],
            r.out,
            r.plain,
        )


def show_outbox(remote: Remote, r: Renderer, params: dict[str, str]) -> None:
    answer = remote.operator("outbox", params)
    if r.as_json:
        r.json(answer)
        return
    rows = [
        [
            str(row["id"]),
            row["kind"],
            str(row.get("taskId") or row.get("promiseId") or "-"),
            row["address"],
            r.state(row["state"]),
            str(row["attempts"]),
            row.get("lastCode") or "-",
            instant(row["availableAt"], r.now) if row["state"] == "pending" else "-",
        ]
        for row in answer["rows"]
    ]
    if not rows:
        print("no outbox rows", file=r.out)
        return
    table(["ID", "KIND", "FOR", "ADDRESS", "STATE", "TRIES", "LAST", "NEXT"], rows, r.out, r.plain)
    if answer.get("next"):
        print(f"(more: --before {answer['next']})", file=r.out)
