"""The dashboard's routes in-process (the app over httpx's ASGI transport): the
setting turns it off, and the operator reads it added refuse what they cannot
answer."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from troth.server.config import Settings
from troth.server.run import build_app


def get(settings: Settings, path: str) -> httpx.Response:
    async def go() -> httpx.Response:
        app = build_app(settings)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://troth") as c:
            return await c.get(path)

    return asyncio.run(go())


def test_ui_off_answers_404_and_on_serves_the_files() -> None:
    assert get(Settings(store="memory", ui=False), "/ui/").status_code == 404
    on = Settings(store="memory")
    page = get(on, "/ui/")
    assert page.status_code == 200 and 'src="app.js"' in page.text
    assert get(on, "/ui/app.css").headers["content-type"].startswith("text/css")
    assert get(on, "/ui/app.js").headers["x-content-type-options"] == "nosniff"


def test_promise_and_tree_need_an_id_and_answer_null_for_nothing() -> None:
    s = Settings(store="memory")
    assert get(s, "/ops/promise").status_code == 400
    assert get(s, "/ops/tree").status_code == 400
    assert get(s, "/ops/promise?id=nope").json()["promise"] is None
    tree = get(s, "/ops/tree?id=nope").json()
    assert tree["promises"] == [] and tree["tasks"] == {} and tree["cut"] is False


def test_the_dashboard_bench_runs_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m troth.bench.ui`` (docs/benchmarks.md) on 300 promises: every view's
    requests answer 200 (it asserts so) and the table is printed."""
    from troth.bench.ui import main

    assert main(["300", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "/ops/tree?id=wf&limit=1000" in out and "per view" in out
