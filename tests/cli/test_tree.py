"""``troth tree`` against a real server on every backend: a workflow built as the SDKs
tag one (origin, parent, scope, timer, target), drawn with states and tasks."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from helpers.support import RunningServer
from troth.cli.main import main

FAR = 10**13


def func(name: str) -> dict[str, Any]:
    call = {"func": name, "args": [], "version": 1}
    return {"headers": {}, "data": base64.b64encode(json.dumps(call).encode()).decode()}


def child(server: RunningServer, id: str, parent: str, **tags: str) -> None:
    lineage = {"resonate:origin": "wf", "resonate:parent": parent, "resonate:branch": id}
    server.ok(
        "promise.create",
        {"id": id, "timeoutAt": FAR, "param": func(id.split(":")[-1]), "tags": {**lineage, **tags}},
    )


def workflow(server: RunningServer, wide: int = 0) -> None:
    """wf (targeted: a task) → wf:1 (run, resolved, with ``wide`` resolved children and
    one pending), wf:2 (rpc to a worker group, pending: a task), wf:3 (a sleep)."""
    root = {"resonate:origin": "wf", "resonate:target": "poll://any@workers"}
    server.ok("promise.create", {"id": "wf", "timeoutAt": FAR, "param": func("main"), "tags": root})
    child(server, "wf:1", "wf", **{"resonate:scope": "local"})
    for k in range(wide):
        child(server, f"wf:1.{k:02d}", "wf:1", **{"resonate:scope": "local"})
        server.ok("promise.settle", {"id": f"wf:1.{k:02d}", "state": "resolved", "value": {}})
    child(server, "wf:1.zz", "wf:1", **{"resonate:scope": "local"})
    child(
        server, "wf:2", "wf", **{"resonate:scope": "global", "resonate:target": "poll://any@math"}
    )
    child(server, "wf:3", "wf", **{"resonate:timer": "true"})


def tree(server: RunningServer, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    code = main(["tree", "wf", "--server", server.url, *flags])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_the_call_graph_with_states_functions_and_tasks(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    workflow(server)
    lines = tree(server, capsys).splitlines()
    assert lines[0].split()[:2] == ["wf", "pending"]
    assert "main" in lines[0] and "task pending v0" in lines[0]
    assert lines[1].startswith("├── wf:1  pending") and "run 1" in lines[1]
    assert lines[2].startswith("│   └── wf:1.zz  pending")
    assert lines[3].startswith("├── wf:2  pending") and "rpc 2" in lines[3]
    assert "task pending v0" in lines[3]  # an RPC's task, waiting for a worker of `math`
    assert lines[4].startswith("└── wf:3  pending") and "sleep until" in lines[4]
    assert lines[5] == "(5 promises: 5 pending)"


def test_wide_runs_of_settled_siblings_fold_and_unfold(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    workflow(server, wide=30)
    folded = tree(server, capsys)
    assert "wf:1.00  resolved" in folded and "wf:1.01  resolved" in folded
    assert "… 27 more settled (27 resolved)" in folded
    assert "wf:1.29  resolved" in folded and "wf:1.zz  pending" in folded
    assert "wf:1.15" not in folded
    assert folded.splitlines()[-1] == "(35 promises: 5 pending, 30 resolved)"
    unfolded = tree(server, capsys, "--all")
    assert all(f"wf:1.{k:02d}  resolved" in unfolded for k in range(30))
    as_json = json.loads(tree(server, capsys, "--json"))
    assert as_json["promise"]["id"] == "wf" and as_json["task"]["state"] == "pending"
    assert [c["promise"]["id"] for c in as_json["children"]] == ["wf:1", "wf:2", "wf:3"]
    assert len(as_json["children"][0]["children"]) == 31


def test_an_unknown_root_is_refused(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tree", "nope", "--server", server.url]) == 1
    assert "promise.get refused: 404" in capsys.readouterr().err
