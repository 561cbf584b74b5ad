"""Outbound auth for HTTP push (docs/security.md): the bearer token troth sends with
every ``execute`` and ``unblock`` POST — one per destination host (``push_tokens``,
``host:port`` before ``host``) or one for all (``push_token``) — to real local HTTP
endpoints that record the ``Authorization`` header.  Tokens are never logged."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from helpers.hook import Hook, hook_server
from helpers.support import running_server
from troth.server.config import ConfigError, Settings, load, push_token_map
from troth.transport.http import PushTokens

FAR = 10**13
ALL, LOCAL, PORT = "tok-all-Zm9v==", "tok-localhost.x.y", "tok-port-4"


def wait(what: str, check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def pushed(hook: Hook, kind: str) -> list[dict[str, str]]:
    """Headers of the POSTs of ``kind`` the hook received."""
    return [headers for headers, body in hook.seen if body.get("kind") == kind]


def execute_to(server: Any, id: str, url: str) -> None:
    server.ok("promise.create", {"id": id, "timeoutAt": FAR, "tags": {"resonate:target": url}})


def test_each_destination_gets_its_token_on_execute_and_unblock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with hook_server() as a, hook_server() as b, hook_server() as c:
        settings = Settings(
            store="memory",
            debug=True,
            push_token=ALL,
            # host (any port), host:port (this one only); the rest get push_token
            push_tokens=f"LOCALHOST={LOCAL},127.0.0.1:{b.port}={PORT}",
        )
        with running_server(settings) as server:
            server.ok("debug.stop", {})  # the delivery loop runs
            execute_to(server, "ja", f"http://localhost:{a.port}/run")
            execute_to(server, "jb", f"http://127.0.0.1:{b.port}/run")
            execute_to(server, "jc", f"http://127.0.0.1:{c.port}/run")
            wait("three executes", lambda: all(pushed(h, "execute") for h in (a, b, c)))
            server.ok(
                "promise.create",
                {"id": "ext", "timeoutAt": FAR, "tags": {"resonate:external": "true"}},
            )
            for hook in (a, b, c):
                address = f"http://127.0.0.1:{hook.port}/unblock"
                if hook is a:
                    address = f"http://localhost:{a.port}/unblock"
                server.ok("promise.register_listener", {"awaited": "ext", "address": address})
            server.ok("promise.settle", {"id": "ext", "state": "resolved", "value": {}})
            wait("three unblocks", lambda: all(pushed(h, "unblock") for h in (a, b, c)))
    for kind in ("execute", "unblock"):
        assert {h["authorization"] for h in pushed(a, kind)} == {f"Bearer {LOCAL}"}
        assert {h["authorization"] for h in pushed(b, kind)} == {f"Bearer {PORT}"}
        assert {h["authorization"] for h in pushed(c, kind)} == {f"Bearer {ALL}"}
    logged = caplog.text + repr(settings)
    for secret in (ALL, LOCAL, PORT):
        assert secret not in logged


def test_without_push_tokens_no_authorization_is_sent() -> None:
    with hook_server() as hook, running_server(Settings(store="memory", debug=True)) as server:
        server.ok("debug.stop", {})
        execute_to(server, "j", f"http://127.0.0.1:{hook.port}/run")
        wait("the execute", lambda: bool(pushed(hook, "execute")))
    assert "authorization" not in pushed(hook, "execute")[0]


def test_only_per_host_tokens_leave_other_hosts_without_one() -> None:
    tokens = PushTokens("", {"hooks.example.com": "t1", "hooks.example.com:8443": "t2"})
    assert tokens.for_address("https://hooks.example.com/x") == "t1"  # port 443
    assert tokens.for_address("https://HOOKS.example.com:8443/x") == "t2"
    assert tokens.for_address("https://other.example.com/x") is None
    assert tokens.for_address("https://other.example.com/x") is None  # remembered
    assert tokens.for_address("http://[bad") is None


def test_a_token_in_clear_text_to_another_host_is_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tokens = PushTokens("s3cret-token")
    with caplog.at_level(logging.WARNING, logger="troth.push"):
        assert tokens.for_address("http://hooks.example.com/a") == "s3cret-token"
        assert tokens.for_address("http://hooks.example.com/b") == "s3cret-token"
        assert tokens.for_address("https://hooks.example.com/c") == "s3cret-token"
        assert tokens.for_address("http://127.0.0.1:9/c") == "s3cret-token"
    warnings = [r.getMessage() for r in caplog.records if r.name == "troth.push"]
    assert len(warnings) == 1 and "hooks.example.com over plain http" in warnings[0]
    assert "s3cret" not in caplog.text


def test_push_tokens_in_every_form(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "troth.toml").write_text(
        'push_token = "all"\n[push_tokens]\n"hooks.example.com" = "abc=="\n"h2:8443" = "x"\n'
    )
    s = load(environ={})
    assert s.push_token == "all"
    assert push_token_map(s.push_tokens) == {"hooks.example.com": "abc==", "h2:8443": "x"}
    s = load(environ={"TROTH_PUSH_TOKENS": "a.example=1, b.example:80=2"})
    assert push_token_map(s.push_tokens) == {"a.example": "1", "b.example:80": "2"}
    with pytest.raises(ConfigError, match="entry 2 is not host=token") as refused:
        load(environ={"TROTH_PUSH_TOKENS": "a.example=1,secret-without-host"})
    assert "secret-without-host" not in str(refused.value)
