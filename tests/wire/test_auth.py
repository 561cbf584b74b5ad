"""Access control over a real socket (server/ingress/auth.py, docs/security.md): 401 and 403
as envelopes, a prefix token confined to its ids in every request kind (a refusal
changes nothing), searches narrowed, poll groups, the operator paths; and the
``idPrefix`` search filter itself on every backend.  Keys are made here."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from helpers.support import VERSION, RunningServer, running_server
from troth.server.config import Settings

KEY = ed25519.Ed25519PrivateKey.generate()
_corr = itertools.count(1)


def token(key: Any = KEY, alg: str = "EdDSA", **claims: Any) -> str:
    """A token valid for a day: module-level tokens are minted at collection, and the
    whole suite runs longer than ten minutes before this module's tests may."""
    return jwt.encode({"exp": int(time.time()) + 86_400, **claims}, key, algorithm=alg)


ADMIN = token(role="admin")
A = token(prefix="a.")


@pytest.fixture(scope="module")
def authed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    pub = tmp_path_factory.mktemp("keys") / "pub.pem"
    pub.write_bytes(
        KEY.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    settings = Settings(store="memory", debug=True, access_log=False, auth_publickey=str(pub))
    with running_server(settings) as server:
        yield server


def call(
    srv: RunningServer, kind: str, data: Any, tok: str | None, via: str = "head"
) -> tuple[int, Any]:
    head: dict[str, Any] = {"corrId": f"a-{next(_corr)}", "version": VERSION}
    headers = {}
    if tok is not None and via == "head":
        head["auth"] = tok
    elif tok is not None:
        headers["Authorization"] = f"Bearer {tok}"
    r = srv.client.post("/", json={"kind": kind, "head": head, "data": data}, headers=headers)
    body = r.json()
    assert body["kind"] == kind and body["head"]["corrId"] == head["corrId"], body
    assert r.status_code == body["head"]["status"], (r.status_code, body)
    return body["head"]["status"], body["data"]


def ok(srv: RunningServer, kind: str, data: Any, tok: str = ADMIN) -> Any:
    status, body = call(srv, kind, data, tok)
    assert status == 200, (kind, status, body)
    return body


def snap(srv: RunningServer) -> Any:
    return ok(srv, "debug.snap", {})


def create(id: str, target: str | None = None) -> dict[str, Any]:
    tags = {"resonate:target": target} if target else {}
    return {"id": id, "timeoutAt": 10**13, "tags": tags}


@pytest.fixture
def srv(authed: RunningServer) -> RunningServer:
    """Two tenants' promises, tasks (acquired by worker w) and schedules."""
    ok(authed, "debug.reset", {})
    for t in ("a", "b"):
        ok(authed, "promise.create", create(f"{t}.p"))
        ok(
            authed,
            "task.create",
            {
                "pid": "w",
                "ttl": 60000,
                "action": {"kind": "promise.create", "data": create(f"{t}.t", "poll://any@g")},
            },
        )
        ok(
            authed,
            "schedule.create",
            {
                "id": f"{t}.s",
                "cron": "0 3 * * *",
                "promiseId": f"{t}.{{{{.timestamp}}}}",
                "promiseTimeout": 1000,
            },
        )
    return authed


def test_no_token_bad_token_expired_wrong_key_alg_none_are_401(srv: RunningServer) -> None:
    before = snap(srv)
    other = ed25519.Ed25519PrivateKey.generate()
    bad = {
        None: "no token",
        "garbage": "invalid token",
        token(role="admin", exp=int(time.time()) - 3600): "expired",
        token(other, role="admin"): "signature",
        jwt.encode(
            {"exp": int(time.time()) + 60, "role": "admin"}, "", algorithm="none"
        ): "algorithm",
        jwt.encode({"role": "admin"}, KEY, algorithm="EdDSA"): "'exp'",
    }
    for tok, why in bad.items():
        for via in ("head", "bearer"):
            status, message = call(
                srv, "promise.settle", {"id": "a.p", "state": "resolved"}, tok, via
            )
            assert status == 401 and why in message, (why, via, message)
    assert snap(srv) == before


def test_the_bearer_header_alone_authenticates(srv: RunningServer) -> None:
    assert call(srv, "promise.get", {"id": "a.p"}, A, via="bearer")[0] == 200
    assert call(srv, "promise.get", {"id": "a.p"}, A, via="head")[0] == 200


def acquire(id: str) -> dict[str, Any]:
    return {"id": id, "version": 1, "pid": "w2", "ttl": 1000}


def inner(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "data": data}


#: Each names one id outside prefix ``a.`` (the others inside): every kind, every field.
OUTSIDE: list[tuple[str, dict[str, Any]]] = [
    ("promise.get", {"id": "b.p"}),
    ("promise.create", create("b.new")),
    ("promise.settle", {"id": "b.p", "state": "resolved"}),
    ("promise.register_callback", {"awaited": "b.p", "awaiter": "a.t"}),
    ("promise.register_callback", {"awaited": "a.p", "awaiter": "b.t"}),
    ("promise.register_listener", {"awaited": "b.p", "address": "poll://any@g"}),
    ("task.get", {"id": "b.t"}),
    ("task.create", {"pid": "w", "ttl": 1, "action": inner("promise.create", create("b.n"))}),
    ("task.acquire", acquire("b.t")),
    ("task.fence", {"id": "a.t", "version": 1, "action": inner("promise.create", create("b.x"))}),
    (
        "task.fence",
        {
            "id": "a.t",
            "version": 1,
            "action": inner("promise.settle", {"id": "b.p", "state": "resolved"}),
        },
    ),
    ("task.fence", {"id": "b.t", "version": 1, "action": inner("promise.create", create("a.x"))}),
    (
        "task.heartbeat",
        {"pid": "w", "tasks": [{"id": "a.t", "version": 1}, {"id": "b.t", "version": 1}]},
    ),
    (
        "task.suspend",
        {
            "id": "a.t",
            "version": 1,
            "actions": [inner("promise.register_callback", {"awaited": "b.p", "awaiter": "a.t"})],
        },
    ),
    ("task.suspend", {"id": "b.t", "version": 1, "actions": []}),
    (
        "task.fulfill",
        {
            "id": "b.t",
            "version": 1,
            "action": inner("promise.settle", {"id": "b.t", "state": "resolved"}),
        },
    ),
    ("task.release", {"id": "b.t", "version": 1}),
    ("task.halt", {"id": "b.t"}),
    ("task.continue", {"id": "b.t"}),
    ("schedule.get", {"id": "b.s"}),
    ("schedule.delete", {"id": "b.s"}),
    (
        "schedule.create",
        {"id": "b.s2", "cron": "* * * * *", "promiseId": "a.{{.timestamp}}", "promiseTimeout": 1},
    ),
    (
        "schedule.create",
        {"id": "a.s2", "cron": "* * * * *", "promiseId": "b.{{.timestamp}}", "promiseTimeout": 1},
    ),
    ("promise.search", {"idPrefix": "b."}),
    ("debug.snap", {}),
    ("debug.reset", {}),
]


def test_a_prefix_token_is_refused_every_id_outside_its_prefix(srv: RunningServer) -> None:
    before = snap(srv)
    for kind, data in OUTSIDE:
        status, message = call(srv, kind, data, A)
        assert status == 403, (kind, data, status, message)
        assert message.startswith("Forbidden"), message
    assert snap(srv) == before  # a refusal changes nothing


def test_the_same_requests_inside_the_prefix_are_served(srv: RunningServer) -> None:
    inside = [(k, _swap(d)) for k, d in OUTSIDE if not k.startswith("debug.")]
    for kind, data in inside:
        status, message = call(srv, kind, data, A)
        assert status not in (401, 403), (kind, data, status, message)
    # A template that begins with {{.id}} is under the schedule's own (checked) id.
    body = {
        "id": "a.s3",
        "cron": "* * * * *",
        "promiseId": "{{.id}}.{{.timestamp}}",
        "promiseTimeout": 1,
    }
    assert call(srv, "schedule.create", body, A)[0] == 200


def _swap(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _swap(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_swap(v) for v in data]
    return "a." + data[2:] if isinstance(data, str) and data.startswith("b.") else data


def test_claims_without_a_usable_prefix_and_the_empty_prefix(srv: RunningServer) -> None:
    for tok in (token(), token(prefix=None), token(prefix=7), token(role="user")):
        assert call(srv, "promise.get", {"id": "a.p"}, tok)[0] == 403
    every = token(prefix="")
    assert call(srv, "promise.get", {"id": "b.p"}, every)[0] == 200
    assert call(srv, "debug.snap", {}, every)[0] == 403  # debug is for admins only
    assert call(srv, "debug.snap", {}, token(role="Admin"))[0] == 200


def test_searches_with_a_prefix_token_see_only_their_ids(srv: RunningServer) -> None:
    assert [p["id"] for p in ok(srv, "promise.search", {}, A)["promises"]] == ["a.p", "a.t"]
    assert [p["id"] for p in ok(srv, "promise.search", {"idPrefix": "a.t"}, A)["promises"]] == [
        "a.t"
    ]
    assert [t["id"] for t in ok(srv, "task.search", {}, A)["tasks"]] == ["a.t"]
    assert [s["id"] for s in ok(srv, "schedule.search", {}, A)["schedules"]] == ["a.s"]
    everything = ok(srv, "promise.search", {}, ADMIN)["promises"]
    assert [p["id"] for p in everything] == ["a.p", "a.t", "b.p", "b.t"]


def poll(srv: RunningServer, group: str, tok: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {tok}"} if tok else {}
    with srv.client.stream("GET", f"/poll/{group}/w9", headers=headers, timeout=5) as r:
        first = next(r.iter_lines()) if r.status_code == 200 else r.read().decode()
        return r.status_code, first


def test_poll_authenticates_and_a_token_may_be_confined_to_groups(srv: RunningServer) -> None:
    assert poll(srv, "g1", None)[0] == 401
    assert poll(srv, "g1", "bad")[0] == 401
    confined = token(prefix="a.", groups=["g1"])
    assert poll(srv, "g1", confined) == (200, ": connected")
    status, body = poll(srv, "g2", confined)
    assert status == 403 and "g2" in body
    assert poll(srv, "g2", A) == (200, ": connected")  # no groups claim: every group
    assert poll(srv, "g2", ADMIN) == (200, ": connected")
    assert poll(srv, "g1", token(prefix="a.", groups="g1"))[0] == 403  # not a list


def test_operator_paths_need_an_admin_and_health_stays_open(srv: RunningServer) -> None:
    c = srv.client
    assert c.get("/health").status_code == 200
    assert c.get("/ready").status_code == 200
    r = c.get("/metrics")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert c.get("/metrics", headers={"Authorization": f"Bearer {A}"}).status_code == 403
    r = c.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200 and "troth_requests_total" in r.text
    for path in ("/ops/explain?id=a.p", "/ops/workers", "/ops/outbox", "/ops/counts"):
        assert c.get(path, headers={"Authorization": f"Bearer {A}"}).status_code == 403
        assert c.get(path).status_code == 401
    r = c.get("/ops/explain?id=nobody", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200 and r.json()["root"]["reason"] == "not_found"


def test_a_token_is_never_logged(srv: RunningServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    call(srv, "promise.get", {"id": "b.p"}, A)
    call(srv, "promise.get", {"id": "a.p"}, A + "x")
    assert A not in caplog.text and A[:40] not in caplog.text


# -- the idPrefix filter itself, on every backend, without auth ----------------------


def ids(
    srv: RunningServer, kind: str, data: dict[str, Any], key: str
) -> tuple[list[str], str | None]:
    body = srv.ok(kind, data)
    return [x["id"] for x in body[key]], body.get("cursor")


def test_id_prefix_search_pages_through_exactly_the_prefixed_ids(server: RunningServer) -> None:
    for id in ["a", "a.", "a.1", "a.2", "a.3", "a/", "ab", "b", "a."]:
        server.ok("promise.create", {"id": id, "timeoutAt": 10**13})
    assert ids(server, "promise.search", {"idPrefix": "a."}, "promises") == (
        ["a.", "a.1", "a.2", "a.3"],
        None,
    )
    # Page by page: the prefix itself first, cursors continue inside the run.
    seen, cursor = [], None
    while True:
        data: dict[str, Any] = {"idPrefix": "a.", "limit": 1}
        if cursor:
            data["cursor"] = cursor
        page, cursor = ids(server, "promise.search", data, "promises")
        seen += page
        if cursor is None:
            break
    assert seen == ["a.", "a.1", "a.2", "a.3"]
    assert ids(server, "promise.search", {"idPrefix": "zz"}, "promises") == ([], None)
    assert ids(server, "promise.search", {"idPrefix": "a"}, "promises")[0] == [
        "a",
        "a.",
        "a.1",
        "a.2",
        "a.3",
        "a/",
        "ab",
    ]
    # With other filters: the exact-id candidate is filtered too.
    server.ok("promise.settle", {"id": "a.", "state": "resolved"})
    assert ids(server, "promise.search", {"idPrefix": "a.", "state": "pending"}, "promises")[0] == [
        "a.1",
        "a.2",
        "a.3",
    ]
    assert server.call("promise.search", {"idPrefix": 3})[0] == 400


def test_id_prefix_on_task_and_schedule_searches(server: RunningServer) -> None:
    for id in ("t.1", "t.2", "u.1"):
        server.ok(
            "task.create",
            {
                "pid": "w",
                "ttl": 1000,
                "action": {"kind": "promise.create", "data": create(id, "poll://any@g")},
            },
        )
        server.ok(
            "schedule.create",
            {"id": id, "cron": "0 3 * * *", "promiseId": "x.{{.timestamp}}", "promiseTimeout": 1},
        )
    assert ids(server, "task.search", {"idPrefix": "t."}, "tasks")[0] == ["t.1", "t.2"]
    assert ids(server, "task.search", {"idPrefix": "t.", "state": "pending"}, "tasks")[0] == []
    assert ids(server, "schedule.search", {"idPrefix": "u"}, "schedules")[0] == ["u.1"]
    assert ids(server, "schedule.search", {"idPrefix": "t.1"}, "schedules")[0] == ["t.1"]
