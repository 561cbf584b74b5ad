"""The dashboard's routes in-process (the app over httpx's ASGI transport): the
setting turns it off, and the operator reads it added refuse what they cannot
answer."""

from __future__ import annotations

import asyncio
from typing import Any

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


def test_promises_by_tags_take_a_json_object() -> None:
    s = Settings(store="memory")
    assert get(s, "/ops/promises?tags=team%3Da").status_code == 400
    assert get(s, "/ops/promises?tags=%7B%22a%22%3A1%7D").status_code == 400  # {"a":1}
    assert get(s, "/ops/promises?order=desc&tags=%7B%22a%22%3A%22b%22%7D").status_code == 400
    answer = get(s, "/ops/promises?tags=%7B%22a%22%3A%22b%22%7D").json()
    assert answer == {"promises": [], "next": None, "looked": 0}


def test_timeline_interleaves_task_events_and_says_which_times_are_not_recorded() -> None:
    """A task created acquired (v1, pid w1), released, offered again (an execute of
    v1), acquired by w2 (v2): its events in order, the unrecorded ones without a time."""

    async def go() -> dict[str, Any]:
        app = build_app(Settings(store="memory", retry_timeout=60_000))
        await app.startup()
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://troth") as c:

                async def call(kind: str, data: dict[str, Any]) -> Any:
                    head = {"corrId": kind, "version": "2026-04-01"}
                    r = await c.post("/", json={"kind": kind, "head": head, "data": data})
                    assert r.json()["head"]["status"] == 200, r.text
                    return r.json()["data"]

                tags = {"resonate:origin": "job", "resonate:target": "poll://any@g"}
                create = {"id": "job", "timeoutAt": 2**53, "param": {}, "tags": tags}
                action = {"kind": "promise.create", "head": {}, "data": create}
                await call("task.create", {"pid": "w1", "ttl": 30_000, "action": action})
                await call("task.release", {"id": "job", "version": 1})
                for _ in range(200):  # the execute of v1 is written by the timer loop
                    rows = (await c.get("/ops/outbox?task=job")).json()["rows"]
                    if rows:
                        break
                    await asyncio.sleep(0.01)
                await call("task.acquire", {"id": "job", "version": 1, "pid": "w2", "ttl": 30_000})
                body: dict[str, Any] = (await c.get("/ops/timeline?id=job")).json()
                return body
        finally:
            await app.shutdown()

    answer = asyncio.run(go())
    events = [(e["event"], e.get("version"), e.get("pid"), e["at"]) for e in answer["events"]]
    kinds = [e[0] for e in events]
    assert kinds[:2] == ["created", "task created"], events
    assert kinds[2:5] == ["acquired", "left acquired", "execute"], events
    assert kinds[5:] == ["acquired", "lease renewed"], events
    acquired_v1, left, execute, acquired_v2, renewed = events[2:]
    assert acquired_v1[1] == 1 and acquired_v1[3] is None  # no time recorded
    assert left[1] == 1 and left[3] is None
    assert execute[1] == 1 and execute[3] is not None
    assert acquired_v2 == ("acquired", 2, "w2", None)
    assert renewed[1:3] == (2, "w2") and renewed[3] is not None
    texts = " ".join(e["text"] for e in answer["events"])
    assert "time not recorded" in texts and "released, or its lease lapsed" in texts
