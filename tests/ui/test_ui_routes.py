"""The dashboard's routes in-process (the app over httpx's ASGI transport): the
setting turns it off, and the operator reads it added refuse what they cannot
answer."""

from __future__ import annotations

import asyncio

import httpx

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
