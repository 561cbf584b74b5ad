"""Durable functions through ``troth mcp``: a real Python SDK worker's workflow
started with ``invoke``, its result read with ``promise-wait`` and its call graph
with ``tree``; and ``explain`` on a call stuck for want of a worker."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest

from helpers.mcp_session import call, stdio
from helpers.sdk_env import Procs, PythonSdk
from helpers.troth_process import LoggedServer

pytestmark = pytest.mark.timeout(180)


def test_invoke_a_workflow_on_a_real_worker_and_read_its_result(
    procs: Procs, python_sdk: PythonSdk, server: LoggedServer
) -> None:
    worker = procs.start(
        "py-worker",
        python_sdk.program("example.py", "worker", "--url", server.url, "--seconds", "150"),
    )
    procs.wait_line(worker, r"^worker listening", 60)
    wf = f"mcp-wf-{uuid.uuid4().hex[:6]}"

    async def scenario() -> None:
        async with stdio(server.url) as client:
            started = await call(
                client,
                "invoke",
                func="workflow",
                id=wf,
                args=["world"],
                target="workers",  # a group's name, as the SDKs take it
                timeout="5m",
            )
            assert started["promise"]["state"] == "pending"
            assert started["promise"]["tags"]["resonate:target"] == "poll://any@workers"
            assert started["decoded"]["param"] == {
                "func": "workflow",
                "args": ["world"],
                "version": 1,
            }
            done: dict[str, Any] = {}
            with anyio.fail_after(90):
                while not done.get("settled"):
                    done = await call(client, "promise-wait", id=wf, timeout="60s")
            assert done["promise"]["state"] == "resolved"
            assert done["decoded"]["value"] == "hello world!"
            # Invoking the same id again starts nothing new: the result stands.
            again = await call(client, "invoke", func="workflow", id=wf, args=["world"])
            assert again["decoded"]["value"] == "hello world!"
            graph = await call(client, "tree", id=wf)
            assert graph["promise"]["id"] == wf and graph["task"]["state"] == "fulfilled"
            children = {c["promise"]["id"]: c["promise"] for c in graph["children"]}
            assert set(children) == {f"{wf}:1", f"{wf}:2"}, children
            assert all(p["state"] == "resolved" for p in children.values())
            assert children[f"{wf}:2"]["tags"].get("resonate:timer") == "true"

    anyio.run(scenario)


def test_explain_a_call_stuck_for_want_of_a_worker(server: LoggedServer) -> None:
    async def scenario() -> None:
        async with stdio(server.url) as client:
            await call(client, "invoke", func="absent", id="stuck-1", target="poll://any@nobody")
            answer: dict[str, Any] = {}
            with anyio.fail_after(30):
                while {b["reason"] for b in answer.get("blockers", [])} != {"no_worker"}:
                    answer = await call(client, "explain", id="stuck-1")
                    await anyio.sleep(0.2)
            assert answer["done"] is False
            [blocker] = answer["blockers"]
            assert blocker["id"] == "stuck-1"
            assert "no worker connected to group `nobody`" in blocker["text"], blocker["text"]
            assert answer["root"]["function"] == "absent"
            # The wait gives up at its timeout: the call is still pending.
            late = await call(client, "promise-wait", id="stuck-1", timeout="1s")
            assert late["settled"] is False

    anyio.run(scenario)


def test_an_agent_answers_a_workflow_waiting_for_a_person(
    procs: Procs, python_sdk: PythonSdk, server: LoggedServer
) -> None:
    """The other way round: an SDK workflow parks on ``ctx.promise()``; the agent finds
    it pending, settles it with ``promise-settle`` and reads the workflow's result."""
    wf = f"mcp-hitl-{uuid.uuid4().hex[:6]}"
    run = procs.start("hitl", python_sdk.program("hitl.py", "run", "--url", server.url, "--id", wf))
    [line] = procs.wait_line(run, r"^awaiting \S+$", 60)
    awaited = line.split()[1]

    async def scenario() -> None:
        async with stdio(server.url) as client:
            found = await call(
                client, "promise-search", state="pending", tags={"resonate:origin": wf}
            )
            assert awaited in {p["id"] for p in found["promises"]}
            settled = await call(
                client, "promise-settle", id=awaited, resolution="resolve", value={"data": "yes"}
            )
            assert settled["promise"]["state"] == "resolved"
            done: dict[str, Any] = {}
            with anyio.fail_after(90):
                while not done.get("settled"):
                    done = await call(client, "promise-wait", id=wf, timeout="60s")
            assert done["decoded"]["value"] == f"request {wf}: yes"

    anyio.run(scenario)
    procs.wait_line(run, rf"^result -> request {wf}: yes$", 30)
