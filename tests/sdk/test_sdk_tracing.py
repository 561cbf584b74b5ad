"""One trace per workflow, across two nodes, with the real Python SDK (which sends
no trace context of its own): server/tracing.py and docs/operations.md, "Tracing".

Two ``troth serve --tracing`` nodes on one PostgreSQL database export their spans to
one OTLP/HTTP receiver (tests/helpers/otlp.py).  A worker of group ``workers``
holds its SSE stream on ``n1``; the client runs ``nap`` workflows on ``n2``
(tests/sdk/recovery.py: a local child call, a durable sleep, then an rpc to the
worker).  Every request and delivery span of one workflow — on either node, from
either SDK process, before and after the sleep — must be in one trace, that trace
must be the workflow's alone, and its root must be the request that created the
workflow.  The span tree of one workflow is printed (docs/operations.md shows it).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip(
    "opentelemetry.sdk", reason="tracing needs the otel extra: pip install -e '.[otel]'"
)

from helpers.cluster import Node
from helpers.otlp import Span, otlp_receiver
from helpers.pg import throwaway_database
from helpers.sdk_env import Procs, PythonSdk

pytestmark = pytest.mark.timeout(120)

COUNT = 2
SLEEP_S = 1.0


@pytest.fixture
def postgres_url() -> Iterator[str]:
    with throwaway_database("troth_trace_sdk") as url:
        yield url


def names(span: Span) -> list[str]:
    """The promise ids a span is about."""
    ids = list(span.attributes.get("troth.ids", []))
    for key in ("troth.task.id", "troth.promise.id"):
        if key in span.attributes:
            ids.append(span.attributes[key])
    return ids


def of_workflow(spans: list[Span], root: str) -> list[Span]:
    """The spans about the workflow ``root`` (its promises: ``root``, ``root:N``);
    heartbeats are the SDK process's, for all its tasks, not one workflow's."""
    spans = [s for s in spans if s.name != "task.heartbeat"]
    return [
        s
        for s in spans
        if any(i == root or i.startswith((f"{root}.", f"{root}:")) for i in names(s))
    ]


def render(spans: list[Span]) -> str:
    """The spans of one trace as an indented tree, in start order."""
    children: dict[str, list[Span]] = {}
    for s in sorted(spans, key=lambda s: s.start_ns):
        children.setdefault(s.parent_id, []).append(s)
    ids = {s.span_id for s in spans}
    lines: list[str] = []

    def walk(span: Span, depth: int) -> None:
        what = ",".join(names(span)) or "-"
        node = span.resource.get("service.instance.id", "?")
        ms = (span.end_ns - span.start_ns) / 1e6
        lines.append(f"{'  ' * depth}{span.name} {what} [{node}] {ms:.1f} ms")
        for child in children.get(span.span_id, []):
            walk(child, depth + 1)

    for s in sorted(spans, key=lambda s: s.start_ns):
        if s.parent_id not in ids:
            walk(s, 0)
    return "\n".join(lines)


def test_a_workflow_across_two_nodes_is_one_trace(
    python_sdk: PythonSdk, postgres_url: str, procs: Procs
) -> None:
    with otlp_receiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
        n1, n2 = Node(procs, "n1", postgres_url), Node(procs, "n2", postgres_url)
        for node in (n1, n2):
            node.start("--tracing", env=env)
        procs.wait_for("both nodes ready", lambda: n1.ready() and n2.ready(), 30)
        argv = ["worker", "--url", n1.url, "--name", "A"]
        worker = procs.start("worker", python_sdk.program("recovery.py", *argv))
        procs.wait_line(worker, r"^worker A ready", 30)
        procs.wait_for("the worker's stream on n1", lambda: n1.sse_connections() == 1, 30)
        argv = ["nap", "--url", n2.url, "--suffix", "t", "--count", str(COUNT)]
        client = procs.start("client", python_sdk.program("recovery.py", *argv, "--sleep", "1"))
        done = procs.wait_line(client, r"^nap \d+ ->", 60, count=COUNT)
        assert sorted(done) == [f"nap {i} -> {i * i}" for i in range(COUNT)]

        def exported(root: str) -> bool:
            """Both nodes have exported this workflow's spans: its fulfil (on n2)
            and the rpc's acquire (on n1).  Each node exports on its own schedule,
            so the root's fulfil arriving says nothing about n1's last batch."""
            mine = of_workflow(receiver.all(), root)
            fulfils = {s.attributes["troth.ids"][0] for s in mine if s.name == "task.fulfill"}
            acquired = {s.attributes["troth.ids"][0] for s in mine if s.name == "task.acquire"}
            return root in fulfils and len(acquired - {root}) >= 1

        roots = [f"nap-t-{i}" for i in range(COUNT)]
        receiver.wait(
            "every workflow's spans from both nodes", lambda: all(exported(r) for r in roots)
        )
        spans = list(receiver.spans)

    traces = []
    for root in roots:
        mine = of_workflow(spans, root)
        tree = render(mine)
        print(f"-- {root}\n{tree}")
        trace_ids = {s.trace_id for s in mine}
        assert len(trace_ids) == 1, tree
        traces.append(trace_ids.pop())
        # Its root span: the request that created the workflow (the SDK's run).
        tops = [s for s in mine if s.parent_id == ""]
        assert len(tops) == 1, tree
        assert set(tops[0].attributes["troth.ids"]) == {root}, tree
        # Both nodes served it; so did both SDK processes (an rpc and the sleep's
        # resumption included): acquires of the root and of the rpc's promise, and
        # the root's execute delivered after its sleep (after the rpc too, unless the
        # rpc's result was in before the root suspended on it: that suspend is then
        # answered at once, and the root goes on without another execute).
        assert {s.resource["service.instance.id"] for s in mine} == {"n1", "n2"}, tree
        acquired = {s.attributes["troth.ids"][0] for s in mine if s.name == "task.acquire"}
        assert root in acquired and len(acquired) >= 2, tree
        executes = [
            s for s in mine if s.name == "deliver execute" and s.attributes["troth.task.id"] == root
        ]
        assert len(executes) >= 1, tree
        assert any(s.name == "task.fence" for s in mine), tree
    # One trace per workflow: no two share one.
    assert len(set(traces)) == COUNT
