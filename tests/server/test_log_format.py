"""One log format for every line of ``troth serve`` (server/logs.py), uvicorn's
included, in both formats; and no token or secret in any line.

A real process with auth on and push tokens set, logging at debug: requests carry
tokens in ``head.auth`` and in ``Authorization``, forged and unsigned ones are
refused, an ``execute`` is pushed (with its bearer token) to a real local endpoint,
the operator paths are read with an admin token, a malformed HTTP request makes
uvicorn warn; then every line the process printed is checked.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from helpers.hook import hook_server
from helpers.serve_process import serve
from helpers.support import VERSION, free_port
from troth import redact
from troth.cli.token import keygen, sign

PUSH_ALL = "push-all-SECRET-4f1c"
PUSH_HOST = "push-host-SECRET-9d2e"
HOOK_KEY = "hook-key-SECRET-77ab01"
NATS_PASSWORD = "nats-pw-SECRET-5e5e5e"
#: ``time level logger message``: the plain line since the first release.
PLAIN = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ "
)


def leaked(secret: str, text: str) -> bool:
    """Whether ``secret``, or any part of a JWT of it (a signature alone), is in
    ``text``."""
    return any(part in text for part in (secret, *secret.split(".")) if len(part) >= 16)


def post(url: str, kind: str, corr: str, data: Any, auth: str | None = None, **kw: Any) -> Any:
    head: dict[str, Any] = {"corrId": corr, "version": VERSION}
    if auth is not None:
        head["auth"] = auth
    r = httpx.post(f"{url}/", json={"kind": kind, "head": head, "data": data}, timeout=10, **kw)
    return r.json()["head"]["status"]


def exercise(tmp_path: Path, log_format: str) -> tuple[str, list[str]]:
    """Run a server with auth and push tokens through requests that carry secrets;
    return its whole output and the secrets it was given or sent."""
    private, public = keygen(tmp_path / "keys", "ed25519")
    exp = int(time.time()) + 3600
    admin = sign({"role": "admin", "exp": exp}, str(private))
    scoped = sign({"prefix": "a.", "exp": exp}, str(private))
    forged = jwt.encode(
        {"role": "admin", "exp": exp}, "not-the-key-SECRET-0123456789abcdef", algorithm="HS256"
    )
    unsigned = jwt.encode({"role": "admin", "exp": exp}, "", algorithm="none")
    secrets = [admin, scoped, forged, unsigned, PUSH_ALL, PUSH_HOST, HOOK_KEY, NATS_PASSWORD]
    log = tmp_path / "log"
    with hook_server() as hook:
        args = [
            *["serve", "--db", "t.db", "--log-level", "debug", "--log-format", log_format],
            *["--auth-publickey", str(public), "--push-token", PUSH_ALL],
            *["--push-tokens", f"localhost={PUSH_HOST}", "--retry-timeout", "60000"],
            # Nothing listens there: NATS logs that it cannot connect, with its URL.
            *["--nats-url", f"nats://troth:{NATS_PASSWORD}@127.0.0.1:{free_port()}"],
        ]
        with serve(args, tmp_path, log) as (proc, url):
            # A push address may carry a secret of its own (a webhook's key).
            target = {"resonate:target": f"http://127.0.0.1:{hook.port}/run?key={HOOK_KEY}"}
            data = {"id": "a.wf", "timeoutAt": 10**13, "tags": target}
            assert post(url, "promise.create", "c-create", data, admin) == 200
            get = {"id": "a.wf"}
            bearer = {"Authorization": f"Bearer {scoped}"}
            assert post(url, "promise.get", "c-bearer", get, headers=bearer) == 200
            assert post(url, "promise.get", "c-scoped", {"id": "b.x"}, scoped) == 403
            assert post(url, "promise.get", "c-forged", get, forged) == 401
            assert post(url, "promise.get", "c-unsigned", get, unsigned) == 401
            assert post(url, "promise.get", "c-none", get) == 401
            ops = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {admin}"})
            assert ops.status_code == 200
            assert httpx.get(f"{url}/metrics?token={admin}").status_code == 401
            with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as s:
                s.sendall(b"NOT HTTP AT ALL " + admin.encode() + b"\r\n\r\n")
                s.recv(1024)
            deadline = time.monotonic() + 10
            while not any(body.get("kind") == "execute" for _, body in hook.seen):
                assert time.monotonic() < deadline, "no execute was pushed"
                time.sleep(0.02)
            assert hook.seen[0][0]["authorization"] == f"Bearer {PUSH_ALL}"
            time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
    text = log.read_text()
    assert "nats://***@127.0.0.1:" in text  # the NATS URL is named, its password not
    return text, secrets


@pytest.mark.timeout(60)
def test_json_format_every_line_one_object_and_no_secret(tmp_path: Path) -> None:
    text, secrets = exercise(tmp_path, "json")
    lines = text.splitlines()
    records = []
    for line in lines:
        record = json.loads(line)  # every line, uvicorn's and the libraries' too
        assert {"time", "level", "logger", "message"} <= record.keys(), line
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["time"]), line
        records.append(record)
    loggers = {r["logger"] for r in records}
    assert {"troth", "troth.access", "uvicorn.error"} <= loggers, loggers
    started = [r for r in records if r["message"].startswith("Started server process")]
    assert started and started[0]["level"] == "INFO"
    assert any("Invalid HTTP request" in r["message"] for r in records), loggers
    access = {r["corrId"]: r for r in records if r["logger"] == "troth.access"}
    create = access["c-create"]
    assert create["kind"] == "promise.create" and create["ids"] == ["a.wf"]
    assert create["status"] == 200 and isinstance(create["ms"], float) and create["node"]
    assert access["c-bearer"]["status"] == 200 and access["c-bearer"]["ids"] == ["a.wf"]
    assert access["c-scoped"]["status"] == 403
    for corr in ("c-forged", "c-unsigned", "c-none"):
        assert access[corr]["status"] == 401 and access[corr]["ids"] == [], corr
    for secret in secrets:
        assert not leaked(secret, text), secret


@pytest.mark.timeout(60)
def test_plain_format_every_line_one_shape_and_no_secret(tmp_path: Path) -> None:
    text, secrets = exercise(tmp_path, "plain")
    for line in text.splitlines():
        assert PLAIN.match(line), line
    assert re.search(r" INFO uvicorn\.error Started server process \[\d+\]", text)
    assert re.search(r" INFO troth\.access promise\.create corrId=c-create status=200 ms=", text)
    for secret in secrets:
        assert not leaked(secret, text), secret


def test_urls_in_log_lines_lose_their_credentials_and_query_values() -> None:
    assert redact.url("nats://u:pw@a:4222,nats://b:4222") == "nats://***@a:4222,nats://b:4222"
    assert (
        redact.url("https://h.example/run?token=abc&x=1") == "https://h.example/run?token=***&x=***"
    )
    assert redact.url("https://u:key@hooks.example/x") == "https://***@hooks.example/x"
    assert redact.url("http://h:8080/run") == "http://h:8080/run"
    assert redact.url("not a url") == "not a url"


def test_the_handler_writes_to_the_stderr_of_the_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process (a test run, a daemoniser) that swaps stderr after logging was
    configured keeps its lines: the handler looks ``sys.stderr`` up per line."""
    import io
    import logging
    import sys

    from troth.server import logs

    first, second = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        monkeypatch.setattr(sys, "stderr", first)
        logs.configure("info", "plain")
        logging.getLogger("troth.test").info("before the swap")
        first.close()
        monkeypatch.setattr(sys, "stderr", second)
        logging.getLogger("troth.test").info("after the swap")
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
    assert "after the swap" in second.getvalue()
    assert PLAIN.match(second.getvalue())


def test_a_json_line_names_the_span_its_formatter_was_given() -> None:
    """The JSON formatter reads trace ids from the source it was configured with
    (``server/tracing.current_ids`` when tracing is on); without one, or outside a
    span, a line has no ``traceId``."""
    import logging

    from troth.server.logs import JsonFormatter

    record = logging.LogRecord("troth.test", logging.INFO, __file__, 1, "hello", None, None)
    traced = json.loads(JsonFormatter(lambda: ("a" * 32, "b" * 16)).format(record))
    assert (traced["traceId"], traced["spanId"]) == ("a" * 32, "b" * 16)
    assert "traceId" not in json.loads(JsonFormatter(lambda: None).format(record))
    assert "traceId" not in json.loads(JsonFormatter().format(record))
