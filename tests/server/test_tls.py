"""HTTPS served directly (``tls_cert``/``tls_key``): a real ``troth serve`` with a
certificate the test makes, spoken to over TLS — ``POST /`` and the SSE stream —
and the start refused (exit 2, one clear line) for a half or unusable pair."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from helpers.support import VERSION, free_port
from helpers.tls import Cert, self_signed

pytestmark = pytest.mark.timeout(60)


def serve_argv(port: int, *extra: str) -> list[str]:
    return [
        *[sys.executable, "-m", "troth.cli.main", "serve", "--store", "memory"],
        *["--host", "127.0.0.1", "--port", str(port), "--log-level", "info"],
        *extra,
    ]


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Cert, Path]]:
    """``troth serve`` over HTTPS; yields its URL, the certificate and its log file."""
    cert = self_signed(tmp_path)
    port = free_port()
    log = tmp_path / "server.err"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            serve_argv(port, "--tls-cert", str(cert.cert), "--tls-key", str(cert.key)),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/ready", verify=cert.client_context()).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield url, cert, log
    finally:
        proc.terminate()
        proc.wait(10)


def envelope(kind: str, data: object) -> dict[str, object]:
    return {"kind": kind, "head": {"corrId": "c1", "version": VERSION}, "data": data}


def test_post_and_sse_over_https(tls_server: tuple[str, Cert, Path]) -> None:
    url, cert, log = tls_server
    with httpx.Client(base_url=url, verify=cert.client_context(), timeout=10) as client:
        # The worker's stream first, over TLS, then a task for its group.
        with client.stream("GET", "/poll/g/w", headers={"accept": "text/event-stream"}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"] == "text/event-stream"
            chunks = r.iter_raw()
            assert next(chunks).startswith(b": connected")
            created = client.post(
                "/",
                json=envelope(
                    "promise.create",
                    {"id": "p", "timeoutAt": 10**13, "tags": {"resonate:target": "poll://any@g"}},
                ),
            )
            assert created.status_code == 200, created.text
            buffer = b""
            while b"data: " not in buffer or not buffer.endswith(b"\n\n"):
                buffer += next(chunks)
        message = json.loads(buffer[buffer.index(b"data: ") + 6 :])
        assert message["kind"] == "execute"
        assert message["data"]["task"] == {"id": "p", "version": 0}
        # What execute messages tell workers: the server's own https address.
        assert message["head"]["serverUrl"].startswith("https://127.0.0.1:")
        got = client.post("/", json=envelope("promise.get", {"id": "p"}))
        assert got.json()["data"]["promise"]["state"] == "pending"
    assert "troth listening on https://127.0.0.1:" in log.read_text()
    # The same port does not speak plain HTTP.
    with pytest.raises(httpx.HTTPError):
        httpx.post(url.replace("https", "http") + "/", json=envelope("promise.get", {"id": "p"}))


def test_a_client_that_does_not_trust_the_certificate_is_refused(
    tls_server: tuple[str, Cert, Path],
) -> None:
    url, _, _ = tls_server
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{url}/health")


def refused_start(tmp_path: Path, *extra: str) -> str:
    """Start ``troth serve`` with ``extra``; it must exit 2 at once; its stderr."""
    done = subprocess.run(
        serve_argv(free_port(), *extra), capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr


def test_half_or_unusable_pairs_refuse_to_start(tmp_path: Path) -> None:
    cert = self_signed(tmp_path / "a")
    other = self_signed(tmp_path / "b")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    missing = tmp_path / "missing.pem"

    err = refused_start(tmp_path, "--tls-cert", str(cert.cert))
    assert "tls_cert and tls_key go together" in err
    err = refused_start(tmp_path, "--tls-key", str(cert.key))
    assert "tls_cert and tls_key go together" in err
    err = refused_start(tmp_path, "--tls-cert", str(missing), "--tls-key", str(cert.key))
    assert f"tls_cert: cannot read {missing}" in err
    err = refused_start(tmp_path, "--tls-cert", str(cert.cert), "--tls-key", str(missing))
    assert f"tls_key: cannot read {missing}" in err
    err = refused_start(tmp_path, "--tls-cert", str(garbage), "--tls-key", str(cert.key))
    assert "are not a PEM certificate chain and its private key" in err
    # A key that is not the certificate's.
    err = refused_start(tmp_path, "--tls-cert", str(cert.cert), "--tls-key", str(other.key))
    assert "are not a PEM certificate chain and its private key" in err
    assert "PRIVATE KEY" not in err
