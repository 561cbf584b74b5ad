"""``troth mcp`` over stdio, driven by the ``mcp`` package's client against a real
``troth serve``: the tools it lists, promises created, read, searched, settled and
waited on — the wait returning when the test settles the promise from outside,
without polling the server meanwhile."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from helpers.mcp_session import TOOLS, b64, call, refused, settle_from_outside, stdio
from helpers.sdk_env import Procs
from helpers.troth_process import LoggedServer

pytestmark = pytest.mark.timeout(90)


def test_lists_its_tools_with_schemas(server: LoggedServer) -> None:
    async def scenario() -> None:
        async with stdio(server.url) as client:
            listed = await client.list_tools()
            tools = {t.name: t for t in listed.tools}
            assert set(tools) == TOOLS
            for t in tools.values():
                assert t.input_schema["type"] == "object", t.name
                assert len(t.description or "") > 40, t.name
            assert tools["promise-settle"].input_schema["required"] == ["id", "resolution"]

    anyio.run(scenario)


def test_create_read_search_settle(server: LoggedServer) -> None:
    async def scenario() -> None:
        async with stdio(server.url) as client:
            made = await call(
                client,
                "promise-create",
                id="ask-1",
                timeout="1h",
                param={"data": {"question": "ship it?"}},
                tags={"team": "ops"},
            )
            p = made["promise"]
            assert p["state"] == "pending" and p["tags"]["team"] == "ops"
            assert p["tags"]["resonate:external"] == "true"
            assert p["param"]["data"] == b64({"question": "ship it?"})
            assert made["decoded"] == {"param": {"question": "ship it?"}, "value": None}
            assert p["timeoutAt"] - p["createdAt"] == pytest.approx(3_600_000, abs=5_000)
            got = await call(client, "promise-get", id="ask-1")
            assert got["promise"]["id"] == "ask-1"
            found = await call(client, "promise-search", tags={"team": "ops"}, state="pending")
            assert [q["id"] for q in found["promises"]] == ["ask-1"]
            done = await call(
                client, "promise-settle", id="ask-1", resolution="reject", value={"data": "no"}
            )
            assert done["promise"]["state"] == "rejected" and done["decoded"]["value"] == "no"
            # As the SDKs encode values: base64 of JSON, a string included.
            assert done["promise"]["value"]["data"] == b64("no")
            # The server's refusal, as a tool error with its status and message.
            text, info = await refused(client, "promise-get", id="nothing-here")
            assert info["status"] == 404 and text.startswith("promise.get refused: 404")
            # Bad arguments: refused before anything is sent.
            text, _ = await refused(client, "promise-settle", id="ask-1", resolution="maybe")
            assert "resolution" in text and "Traceback" not in text
            text, _ = await refused(client, "promise-create", id="ask-2", timeout="soon")
            assert "timeout" in text
            # A promise that takes no listener (not external): the server's 422, and
            # what to do instead.
            assert (
                server.call(
                    "promise.create", {"id": "plain", "timeoutAt": 10**13, "param": {}, "tags": {}}
                )[0]
                == 200
            )
            text, info = await refused(client, "promise-wait", id="plain", timeout="5s")
            assert info["status"] == 422 and "promise-get" in text, text
        assert server.call("promise.get", {"id": "ask-2"})[0] == 404

    anyio.run(scenario)


def test_wait_returns_when_settled_from_outside(server: LoggedServer) -> None:
    async def scenario() -> None:
        async with stdio(server.url) as client:
            await call(client, "promise-create", id="approval-1", timeout="1h")
            gets_before = server.answered("promise.get", 200)
            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                answer: dict[str, Any] = {}

                async def wait() -> None:
                    answer.update(
                        await call(client, "promise-wait", id="approval-1", timeout="60s")
                    )

                tg.start_soon(wait)
                # Settle once the wait has registered its listener (the server's log).
                with anyio.fail_after(20):
                    while server.answered("promise.register_listener", 200) < 1:
                        await anyio.sleep(0.05)
                await anyio.to_thread.run_sync(
                    settle_from_outside, server, "approval-1", {"approved": True}
                )
            assert time.monotonic() - started < 30
            assert answer["settled"] is True
            assert answer["promise"]["state"] == "resolved"
            assert answer["decoded"]["value"] == {"approved": True}
            # Nothing polled while it waited: one registration, no reads.
            assert server.answered("promise.register_listener", 200) == 1
            assert server.answered("promise.get", 200) == gets_before

            # Already settled: answered at once from the registration itself.
            again = await call(client, "promise-wait", id="approval-1", timeout="30s")
            assert again["settled"] is True and again["promise"]["state"] == "resolved"

            # Nobody settles: back after the timeout, still pending; meanwhile progress
            # notifications for a client that asked for them.
            await call(client, "promise-create", id="approval-2", timeout="1h")
            progress: list[tuple[float, float | None, str | None]] = []

            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                progress.append((done, total, message))

            started = time.monotonic()
            result = await client.call_tool(
                "promise-wait", {"id": "approval-2", "timeout": "3s"}, progress_callback=on_progress
            )
            assert 3.0 <= time.monotonic() - started < 12
            late = result.structured_content
            assert late["settled"] is False and late["promise"]["state"] == "pending"
            # One a second: at 1 s and 2 s (the second may be cut by the end of the wait
            # on a loaded machine).
            message = "waiting for approval-2 to settle"
            assert progress[:1] == [(1.0, 3.0, message)], progress
            assert progress in ([(1.0, 3.0, message)], [(1.0, 3.0, message), (2.0, 3.0, message)])

    anyio.run(scenario)


def test_a_wait_survives_a_server_restart(
    procs: Procs, server: LoggedServer, tmp_path: Path
) -> None:
    """The server is killed while a wait sleeps; once it is back on the same file and
    port, the wait's stream reconnects, registers again, and the settlement made
    after the restart still wakes it."""

    async def scenario() -> None:
        async with stdio(server.url) as client:
            await call(client, "promise-create", id="restart-1", timeout="1h")
            answer: dict[str, Any] = {}
            async with anyio.create_task_group() as tg:

                async def wait() -> None:
                    answer.update(await call(client, "promise-wait", id="restart-1", timeout="60s"))

                tg.start_soon(wait)
                with anyio.fail_after(20):
                    while server.answered("promise.register_listener", 200) < 1:
                        await anyio.sleep(0.05)
                server.kill()
                again = LoggedServer(
                    procs, "sqlite", tmp_path / "troth.db", None, ["--retry-timeout", "1000"],
                    name="server-again",
                )  # fmt: skip
                again.port, again.url = server.port, server.url
                await anyio.to_thread.run_sync(again.start)
                with anyio.fail_after(30):  # the stream is back and the wait re-registered
                    while again.answered("promise.register_listener", 200) < 1:
                        await anyio.sleep(0.05)
                await anyio.to_thread.run_sync(settle_from_outside, again, "restart-1", "late")
            assert answer["settled"] is True and answer["decoded"]["value"] == "late"

    anyio.run(scenario)


def test_schedules(server: LoggedServer) -> None:
    async def scenario() -> None:
        async with stdio(server.url) as client:
            made = await call(
                client,
                "schedule-create",
                id="nightly",
                cron="0 3 * * *",
                promiseId="report.{{.timestamp}}",
                promiseTimeout="2h",
                promiseTags={"kind": "report"},
            )
            s = made["schedule"]
            assert (s["id"], s["cron"], s["promiseTimeout"]) == ("nightly", "0 3 * * *", 7_200_000)
            assert s["promiseTags"] == {"kind": "report"}
            got = await call(client, "schedule-get", id="nightly")
            assert got["schedule"]["promiseId"] == "report.{{.timestamp}}"
            found = await call(client, "schedule-search")
            assert [x["id"] for x in found["schedules"]] == ["nightly"]
            text, _ = await refused(
                client, "schedule-create", id="bad", cron="every day", promiseId="x"
            )
            assert "400" in text, text
            await call(client, "schedule-delete", id="nightly")
            _, info = await refused(client, "schedule-get", id="nightly")
            assert info["status"] == 404

    anyio.run(scenario)


def test_workflow_cancel_cancels_the_tree_and_reports_a_refusal(server: LoggedServer) -> None:
    for id in ("wf-9", "wf-9.1", "wf-9.2", "other"):
        tags = {"resonate:origin": "other" if id == "other" else "wf-9"}
        status, _ = server.call("promise.create", {"id": id, "timeoutAt": 10**13, "tags": tags})
        assert status == 200

    async def scenario() -> None:
        async with stdio(server.url) as client:
            done = await call(client, "workflow-cancel", id="wf-9", reason="agent looping")
            assert (done["canceled"], done["first"][0]) == (3, "wf-9")
            again = await call(client, "workflow-cancel", id="wf-9")
            assert again["canceled"] == 0
            text, _ = await refused(client, "workflow-cancel", id="nobody")
            assert "404" in text and "nobody" in text

    anyio.run(scenario)
    for id in ("wf-9", "wf-9.1", "wf-9.2"):
        assert server.promise_value(id) == ("rejected_canceled", {"reason": "agent looping"})
    assert server.promise_value("other")[0] == "pending"
