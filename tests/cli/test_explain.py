"""``troth explain`` and the operator API (``GET /ops/…``) against a real server on every
backend: each blocked situation that docs/operations.md ("Looking inside") lists, built
on the wire, explained with its evidence, and drawn by the CLI."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from helpers.hook import hook_server
from helpers.sse import stream
from helpers.support import RunningServer
from helpers.wire import rc
from troth.cli.main import main

HOUR = 3_600_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def ops(server: RunningServer, path: str, **params: str) -> tuple[int, Any]:
    r = server.client.get(f"/ops/{path}", params=params)
    return r.status_code, r.json()


def explained(server: RunningServer, id: str) -> dict[str, Any]:
    status, body = ops(server, "explain", id=id)
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def cli(server: RunningServer, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main([*args, "--server", server.url])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def create(server: RunningServer, id: str, tags: dict[str, str], timeout: int = HOUR) -> None:
    lineage = {"resonate:origin": "wf", "resonate:parent": "wf"} if id != "wf" else {}
    server.ok(
        "promise.create",
        {"id": id, "timeoutAt": now_ms() + timeout, "param": {}, "tags": {**lineage, **tags}},
    )


def acquire(server: RunningServer, id: str, pid: str = "w1", ttl: int = 30_000) -> int:
    task = server.ok("task.get", {"id": id})["task"]
    body = server.ok("task.acquire", {"id": id, "version": task["version"], "pid": pid, "ttl": ttl})
    version: int = body["task"]["version"]
    return version


def rpc_root(server: RunningServer, group: str = "workers") -> None:
    create(server, "wf", {"resonate:origin": "wf", "resonate:target": f"poll://any@{group}"})


def test_an_rpc_to_a_group_without_workers_names_the_group(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    group = f"lonely{time.time_ns()}"  # a group no test connected to before
    rpc_root(server, group)
    answer = explained(server, "wf")
    root = answer["root"]
    assert answer["done"] is False and root["reason"] == "no_worker"
    assert root["evidence"]["group"] == group and root["evidence"]["workers"] == 0
    assert f"no worker connected to group `{group}` (" in root["text"]
    # One node remembers since it started; PostgreSQL's worker_groups since ever.
    assert ("(never seen)" in root["text"]) == (server.settings.store == "postgres")
    assert ("none since this server started" in root["text"]) != (
        server.settings.store == "postgres"
    )
    assert f"1 execute to `poll://any@{group}`" in root["text"]
    assert answer["blockers"] == [{"id": "wf", "reason": "no_worker", "text": root["text"]}]
    out = cli(server, capsys, "explain", "wf")
    assert out.splitlines()[0].startswith("wf  pending: task pending for ")
    assert out.splitlines()[-1] == "(1 blocker: no_worker)"


def test_a_connected_worker_is_seen_and_remembered_after_it_leaves(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    rpc_root(server)
    with stream(server, "workers", "w9"):
        root = explained(server, "wf")["root"]
        assert root["reason"] == "delivering" and root["evidence"]["workers"] == 1
        assert "1 worker of `workers` connected" in root["text"]
        status, workers = ops(server, "workers")
        assert status == 200
        group = next(g for g in workers["groups"] if g["group"] == "workers")
        assert [c["pid"] for c in group["connections"]] == ["w9"]
        assert "w9" in cli(server, capsys, "workers")
    deadline = time.monotonic() + 10  # PostgreSQL: the node publishes the drop shortly
    while True:
        root = explained(server, "wf")["root"]
        if root["reason"] == "no_worker" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert root["reason"] == "no_worker"
    assert "(last seen " in root["text"], root["text"]


def test_a_suspended_workflow_walks_down_to_what_holds_it(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    rpc_root(server)
    create(server, "wf:1", {"resonate:scope": "local"})  # a local step, awaited by none
    create(server, "wf:2", {"resonate:scope": "global", "resonate:target": "poll://any@math"})
    create(server, "wf:3", {"resonate:timer": "true"}, timeout=120_000)
    create(server, "wf:4", {"resonate:scope": "global"})  # a human's answer (ctx.promise)
    version = acquire(server, "wf")
    awaited = [rc(id, "wf") for id in ("wf:2", "wf:3", "wf:4")]
    server.ok("task.suspend", {"id": "wf", "version": version, "actions": awaited})

    answer = explained(server, "wf")
    root = answer["root"]
    assert root["reason"] == "awaiting"
    assert root["evidence"]["awaiting"] == ["wf:2", "wf:3", "wf:4"]
    reasons = {f["id"]: f["reason"] for f in root["awaiting"]}
    assert reasons == {"wf:2": "no_worker", "wf:3": "sleeping", "wf:4": "awaiting_settlement"}
    by_id = {f["id"]: f for f in root["awaiting"]}
    assert "group `math`" in by_id["wf:2"]["text"]
    assert "durable sleep until" in by_id["wf:3"]["text"] and "(in 1m" in by_id["wf:3"]["text"]
    assert "1 waiting on it" in by_id["wf:4"]["text"]
    assert sorted(b["id"] for b in answer["blockers"]) == ["wf:2", "wf:3", "wf:4"]

    lines = cli(server, capsys, "explain", "wf").splitlines()
    assert lines[0].startswith("wf  pending: task suspended, awaiting `wf:2`, `wf:3`, `wf:4`")
    assert lines[1].startswith("├── wf:2  pending: task pending")
    assert lines[2].startswith("├── wf:3  pending: durable sleep until")
    assert lines[3].startswith("└── wf:4  pending: waits for a client to settle it")
    assert lines[4] == "(3 blockers: awaiting_settlement, no_worker, sleeping)"

    # Settling the answer and the timer leaves the RPC as the one blocker.
    server.ok("promise.settle", {"id": "wf:4", "state": "resolved", "value": {}})
    answer = explained(server, "wf")
    assert answer["root"]["reason"] == "no_worker"  # wf's task is pending again (resumed)


def test_a_held_lease_names_its_pid_node_and_deadline(server: RunningServer) -> None:
    rpc_root(server)
    acquire(server, "wf", pid="p7", ttl=30_000)
    root = explained(server, "wf")["root"]
    assert root["reason"] == "held"
    assert "task held by pid `p7` (not connected to any node now)" in root["text"]
    assert re.search(r"lease expires in (29|30)s, last heartbeat (now|\d+s ago)", root["text"])
    with stream(server, "workers", "p7"):
        root = explained(server, "wf")["root"]
        node = root["evidence"]["nodes"][0]
        assert f"task held by pid `p7` on node `{node}`" in root["text"]


def test_timed_out_canceled_and_resolved_promises_say_so(server: RunningServer) -> None:
    server.ok("promise.create", {"id": "late", "timeoutAt": 1, "param": {}, "tags": {}})
    late = explained(server, "late")
    assert late["done"] is True and late["root"]["reason"] == "timed_out"
    assert late["root"]["text"].startswith("timed out at 1970-01-01")
    create(server, "wf", {"resonate:external": "true"})
    server.ok("promise.settle", {"id": "wf", "state": "rejected_canceled", "value": {}})
    assert explained(server, "wf")["root"]["reason"] == "canceled"


def test_a_halted_task_and_a_bouncing_task(server: RunningServer) -> None:
    rpc_root(server)
    for _ in range(4):  # taken and given back without progress: a bounce each time
        version = acquire(server, "wf")
        server.ok("task.release", {"id": "wf", "version": version})
    root = explained(server, "wf")["root"]
    assert root["reason"] == "bouncing" and root["evidence"]["bounces"] == 4
    assert "task bounced 4x in" in root["text"] and "next execute held until" in root["text"]
    status, bouncing = ops(server, "bounces")
    assert status == 200 and [t["task"] for t in bouncing["tasks"]] == ["wf"]
    server.ok("task.halt", {"id": "wf"})
    root = explained(server, "wf")["root"]
    assert root["reason"] == "halted" and "troth tasks continue wf" in root["text"]


def test_a_schedule_and_an_unknown_id(server: RunningServer) -> None:
    server.ok(
        "schedule.create",
        {
            "id": "nightly",
            "cron": "0 3 * * *",
            "promiseId": "report.{{.timestamp}}",
            "promiseTimeout": HOUR,
            "promiseParam": {},
            "promiseTags": {},
        },
    )
    root = explained(server, "nightly")["root"]
    assert root["reason"] == "schedule" and "(0 3 * * *): next run 20" in root["text"]
    assert "report.{{.timestamp}}" in root["text"]
    missing = explained(server, "nope")
    assert missing["root"]["reason"] == "not_found" and missing["done"] is False


@pytest.fixture
def refusing_url() -> Iterator[str]:
    with hook_server() as hook:
        hook.status[0] = 404
        yield f"http://127.0.0.1:{hook.port}/hook"


def test_a_push_target_that_answers_404_failed_for_good(
    server: RunningServer, refusing_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server.ok("debug.stop", {})  # the delivery loop runs: the execute is sent
    create(server, "wf", {"resonate:origin": "wf", "resonate:target": refusing_url})
    deadline = time.monotonic() + 10
    while True:
        root = explained(server, "wf")["root"]
        if root["reason"] == "delivery_failed" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert root["reason"] == "delivery_failed", root
    assert f"delivery failed permanently (HTTP 404 from {refusing_url})" in root["text"]
    status, page = ops(server, "outbox", state="failed")
    assert status == 200 and [r["taskId"] for r in page["rows"]] == ["wf"]
    assert page["rows"][0]["lastCode"] == "troth.http.status_404"
    out = cli(server, capsys, "outbox", "--task", "wf")
    assert "troth.http.status_404" in out and refusing_url in out


def test_the_operator_api_refuses_bad_queries(server: RunningServer) -> None:
    assert ops(server, "explain")[0] == 400
    assert ops(server, "outbox", state="lost")[0] == 400
    assert ops(server, "outbox", limit="0")[0] == 400
    assert ops(server, "outbox", limit="x")[0] == 400
    assert ops(server, "nothing")[0] == 404
    rpc_root(server)
    status, counts = ops(server, "counts")
    assert status == 200
    assert counts["promises"] == {"pending": 1} and counts["tasks"] == {"pending": 1}
    assert counts["outbox"] == {"pending": 1} and counts["schedules"] == {"all": 0}


def test_promises_by_id_prefix_and_state_page_in_id_order(server: RunningServer) -> None:
    for id in ("a.1", "a.2", "a.3", "a%", "ab", "b", "ä.1"):
        create(server, id, {"resonate:external": "true"})
    server.ok("promise.settle", {"id": "a.2", "state": "resolved", "value": {}})

    def ids(**params: str) -> tuple[list[str], Any]:
        status, body = ops(server, "promises", **params)
        assert status == 200, body
        return [p["id"] for p in body["promises"]], body["next"]

    assert ids(prefix="a.") == (["a.1", "a.2", "a.3"], None)
    assert ids(prefix="a.", state="pending") == (["a.1", "a.3"], None)
    assert ids(prefix="a.", state="resolved") == (["a.2"], None)
    assert ids(prefix="a%") == (["a%"], None)  # no pattern characters
    assert ids(prefix="ä") == (["ä.1"], None)
    assert ids(prefix="a", limit="2") == (["a%", "a.1"], "a.1")
    assert ids(prefix="a", limit="2", after="a.1") == (["a.2", "a.3"], "a.3")
    assert ids(prefix="a", limit="2", after="a.3") == (["ab"], None)
    assert ids(state="pending", limit="3") == (["a%", "a.1", "a.3"], "a.3")
    assert ops(server, "promises", state="done")[0] == 400
    # The protocol's search by state alone takes the pending index's path; same answer.
    found = server.ok("promise.search", {"state": "pending", "limit": 10})["promises"]
    assert [p["id"] for p in found] == ["a%", "a.1", "a.3", "ab", "b", "ä.1"]


def test_a_schedules_latest_runs_come_newest_first(server: RunningServer) -> None:
    """Runs are ``~{schedule}/{expanded template}``: ``order=desc`` lists the latest."""
    schedule = {
        "id": "every",
        "cron": "* * * * *",
        "promiseId": "run.{{.timestamp}}",
        "promiseTimeout": HOUR,
        "promiseParam": {},
        "promiseTags": {},
    }
    base = 10**12  # 13-digit timestamps, as every real one until 2286
    server.ok("schedule.create", schedule, base)
    for minute in (1, 2, 3):
        server.tick(base + minute * 60_000)
    every = [p["id"] for p in ops(server, "promises", prefix="~every/")[1]["promises"]]
    assert len(every) == 3, every
    status, body = ops(server, "promises", prefix="~every/", order="desc", limit="2")
    assert status == 200, body
    assert [p["id"] for p in body["promises"]] == every[::-1][:2]
    assert ops(server, "promises", prefix="~every/", order="desc", state="pending")[0] == 400
