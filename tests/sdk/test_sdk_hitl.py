"""Human in the loop with the published SDKs: a workflow waits for a person.

A workflow awaits a durable promise of its own (``ctx.promise()``) that nobody but a
person settles; a second client settles it a few seconds later, and the workflow must
then complete with that value.  While it waits it must be *parked* — its task
suspended on the promise — not spinning.  The TypeScript SDK 0.11.5 tags that promise
only ``resonate:scope: global``; before troth counted that tag as external
(docs/protocol.md, "``resonate:scope: global`` is external") every ``task.suspend``
awaiting it was refused with 422 and the SDK released, re-acquired and replayed the
task about a hundred times a second until the answer came.  The Python SDK 0.8.1 tags
the same promise ``resonate:external: "true"`` and never spun; it is here so that both
published clients keep working.

Each test runs ``troth serve`` as a child process (SQLite file, or PostgreSQL on a
throwaway database), the SDK programs ``tests/sdk/hitl_ts.mjs`` / ``tests/sdk/hitl.py``
(environments from ``sdk_env``, as in ``test_sdk_e2e.py``), and counts from the
server's own logs the leases granted on the workflow's task through ``task.acquire``
(the ``troth.grants`` lines) and the ``task.suspend`` refusals (the access log).  A
parked workflow is acquired once, when the answer wakes it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers.sdk_env import NodeSdk, Procs, PythonSdk
from helpers.troth_process import LoggedServer as Server

pytestmark = pytest.mark.timeout(180)

#: How long the "person" takes to answer: long enough that a spinning workflow shows
#: (hundreds of cycles), short enough to keep the suite quick.
ANSWER_AFTER_S = 3.0
#: Leases the waiting workflow may be granted through ``task.acquire``: one when the
#: answer wakes it; the rest is slack for an SDK re-try, never a spin.
MAX_ACQUIRES = 3
#: Bound on any one SDK program.
RUN_TIMEOUT = 60.0
ANSWER = "approved"


@pytest.fixture
def live(procs: Procs, store: str, postgres_url: str | None, tmp_path: Path) -> Iterator[Server]:
    server = Server(procs, store, tmp_path / "troth.db", postgres_url)
    server.start()
    yield server
    assert server.problems() == [], "troth logged errors:\n" + "\n".join(server.problems())


def wait_for_a_person(
    procs: Procs,
    live: Server,
    wf: str,
    run: list[str],
    settle: list[str],
    tagged: Callable[[dict[str, str]], bool],
) -> None:
    """Run the waiting workflow, answer after ``ANSWER_AFTER_S``, check the outcome.

    ``settle`` is the settling program's argv with ``{promise}`` in place of the id
    of the promise the workflow waits on (which it prints); ``tagged`` says whether
    that promise carries the tags this SDK is known to give it."""
    runner = procs.start("workflow", run)
    awaiting = procs.wait_line(runner, r"^awaiting \S+$", RUN_TIMEOUT)[0].split()[1]
    assert awaiting.startswith(f"{wf}:"), awaiting  # a child of the workflow
    procs.wait_for(
        f"{awaiting} to be stored",
        lambda: live.call("promise.get", {"id": awaiting})[0] == 200,
        RUN_TIMEOUT,
    )
    tags = live.call("promise.get", {"id": awaiting})[1]["promise"]["tags"]
    assert tagged(tags), tags
    time.sleep(ANSWER_AFTER_S)  # the person thinks
    _, task = live.call("task.get", {"id": wf})
    waiting_state = task["task"]["state"]
    acquires_while_waiting = live.acquires(wf)
    refused_while_waiting = live.answered("task.suspend", 422)

    settler = procs.start("settler", [a.replace("{promise}", awaiting) for a in settle])
    assert procs.wait_exit(settler, RUN_TIMEOUT).splitlines() == [f"settled {awaiting} resolved"]
    out = procs.wait_exit(runner, RUN_TIMEOUT).splitlines()

    acquires = live.acquires(wf)
    print(
        f"{wf}: {acquires_while_waiting} task.acquire and {refused_while_waiting} "
        f"task.suspend 422 in {ANSWER_AFTER_S} s of waiting; {acquires} task.acquire in all"
    )
    assert acquires <= MAX_ACQUIRES, (
        f"the waiting workflow was acquired {acquires} times "
        f"({acquires_while_waiting} while it waited, "
        f"{refused_while_waiting} task.suspend refused with 422): it spun"
    )
    assert live.answered("task.suspend", 422) == 0
    assert waiting_state == "suspended", task  # parked while it waited
    assert out[-1] == f"result -> request {wf}: {ANSWER}", out
    assert live.promise_value(awaiting) == ("resolved", ANSWER)
    assert live.promise_value(wf) == ("resolved", f"request {wf}: {ANSWER}")
    _, task = live.call("task.get", {"id": wf})
    assert task["task"]["state"] == "fulfilled", task


def test_typescript_workflow_waits_for_a_person(
    node_sdk: NodeSdk, procs: Procs, live: Server
) -> None:
    """``ctx.promise()`` of @resonatehq/sdk 0.11.5 (tagged only ``resonate:scope:
    global``), settled by another process through ``resonate.promises.resolve``."""
    wf = f"hitl-ts-{uuid.uuid4().hex[:8]}"
    wait_for_a_person(
        procs,
        live,
        wf,
        node_sdk.program("hitl_ts.mjs", "run", live.url, wf, "hitl"),
        node_sdk.program("hitl_ts.mjs", "settle", live.url, "{promise}", ANSWER),
        # awaitable by troth's resonate:scope rule alone (docs/protocol.md)
        lambda tags: (
            tags.get("resonate:scope") == "global"
            and "resonate:external" not in tags
            and "resonate:target" not in tags
            and "resonate:timer" not in tags
        ),
    )


def test_python_workflow_waits_for_a_person(
    python_sdk: PythonSdk, procs: Procs, live: Server
) -> None:
    """``ctx.promise()`` of resonate-sdk 0.8.1 (tagged ``resonate:external``), settled
    by another process through ``resonate.promises.resolve``."""
    wf = f"hitl-py-{uuid.uuid4().hex[:8]}"
    wait_for_a_person(
        procs,
        live,
        wf,
        python_sdk.program("hitl.py", "run", "--url", live.url, "--id", wf, "--group", "hitl"),
        python_sdk.program(
            "hitl.py", "settle", "--url", live.url, "--promise", "{promise}", "--value", ANSWER
        ),
        # external by the specification's own predicate
        lambda tags: tags.get("resonate:external") == "true" and "resonate:target" not in tags,
    )
