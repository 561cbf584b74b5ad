"""Bulk settles by search (cli/bulk.py): ``troth promises cancel|resolve|reject`` with
filters instead of an ID, against a real server on a socket (memory, SQLite,
PostgreSQL; with auth on, a prefix token).  What it settles and what it leaves, the
dry run, the confirmation, a run cut short and run again, refusals and exit codes."""

from __future__ import annotations

import base64
import io
import itertools
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from helpers.support import RunningServer, running_server
from troth.cli.main import main
from troth.cli.remote import Remote, Unreachable
from troth.server.config import Settings

KEY = ed25519.Ed25519PrivateKey.generate()


def token(**claims: Any) -> str:
    return jwt.encode({"exp": int(time.time()) + 86_400, **claims}, KEY, algorithm="EdDSA")


ADMIN = token(role="admin")
A = token(prefix="a.")


class Terminal(io.StringIO):
    """Standard input that is a terminal, with the answer typed in advance."""

    def isatty(self) -> bool:
        return True


def cli(
    server: RunningServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    *argv: str,
    stdin: io.StringIO | None = None,
) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", stdin or io.StringIO(""))  # not a terminal
    code = main([*argv, "--server", server.url])
    out, err = capsys.readouterr()
    return code, out, err


def create(server: RunningServer, id: str, tags: dict[str, str] | None = None) -> None:
    data = {"id": id, "timeoutAt": 10**13, "param": {}, "tags": tags or {}}
    server.ok("promise.create", data)


def state(server: RunningServer, id: str) -> str:
    result: str = server.ok("promise.get", {"id": id})["promise"]["state"]
    return result


def states(server: RunningServer, ids: list[str]) -> set[str]:
    return {state(server, id) for id in ids}


BATCH_7 = {"batch": "7"}


@pytest.fixture
def batch(server: RunningServer) -> list[str]:
    """250 pending promises ``job/000``… tagged batch 7 (more than two pages of the
    search), and around them what a bulk settle of ``job/`` batch 7 must leave alone:
    one of batch 8, one outside the prefix, one already resolved."""
    ids = [f"job/{i:03d}" for i in range(250)]
    for id in ids:
        create(server, id, BATCH_7)
    create(server, "job/other", {"batch": "8"})
    create(server, "jobs", BATCH_7)
    create(server, "job/done", BATCH_7)
    server.ok("promise.settle", {"id": "job/done", "state": "resolved", "value": {}})
    return ids


FILTERS = ("--id-prefix", "job/", "--tags", json.dumps(BATCH_7))


def test_dry_run_shows_the_count_and_first_ids_and_changes_nothing(
    server: RunningServer,
    batch: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = server.snap()
    code, out, _ = cli(server, capsys, monkeypatch, "promises", "cancel", *FILTERS, "--dry-run")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "dry run, nothing changed: 250 pending promises found"
    assert [ln.strip() for ln in lines[1:21]] == batch[:20]
    assert lines[21].strip() == "… and 230 more"
    code, out, _ = cli(
        server, capsys, monkeypatch, "promises", "cancel", *FILTERS, "--dry-run", "--json"
    )
    assert code == 0
    assert json.loads(out) == {
        "dryRun": True,
        "state": "rejected_canceled",
        "matched": 250,
        "ids": batch[:20],
    }
    assert server.snap() == before


def test_yes_cancels_every_match_over_several_pages_and_nothing_else(
    server: RunningServer,
    batch: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, err = cli(
        server, capsys, monkeypatch, "promises", "cancel", *FILTERS, "--yes", "--json"
    )
    assert code == 0, err
    assert json.loads(out) == {
        "state": "rejected_canceled",
        "matched": 250,
        "settled": 250,
        "alreadySettled": 0,
        "refused": [],
        "failed": [],
        "complete": True,
    }
    assert states(server, batch) == {"rejected_canceled"}
    assert state(server, "job/other") == "pending"  # other tags
    assert state(server, "jobs") == "pending"  # outside the prefix
    assert state(server, "job/done") == "resolved"  # settled before, left so
    # Progress on stderr, a page at a time.
    assert err.splitlines() == ["settled 100 of ~250", "settled 200 of ~250", "settled 250 of ~250"]
    # Run again: nothing left to do.
    code, out, _ = cli(server, capsys, monkeypatch, "promises", "cancel", *FILTERS, "--yes")
    assert code == 0
    assert "settled as rejected_canceled  0" in out.splitlines()


def test_resolve_by_tags_alone_with_a_value(
    server: RunningServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for id in ("x", "y", "z"):
        create(server, id, {"approval": "q1", "team": id})
    create(server, "w", {"approval": "q2"})
    code, out, err = cli(
        server, capsys, monkeypatch, "promises", "resolve",
        "--tags", '{"approval": "q1"}', "--value", '{"data": {"ok": true}}', "--yes",
    )  # fmt: skip
    assert code == 0, err
    rows = dict(line.rsplit(None, 1) for line in out.splitlines())
    assert rows == {
        "settled as resolved": "3",
        "already settled": "0",
        "refused": "0",
        "failed": "0",
    }
    assert err == ""  # one page: no progress lines
    for id in ("x", "y", "z"):
        promise = server.ok("promise.get", {"id": id})["promise"]
        assert promise["state"] == "resolved"
        assert json.loads(base64.b64decode(promise["value"]["data"])) == {"ok": True}
    assert state(server, "w") == "pending"


def test_a_run_cut_short_finishes_when_run_again(
    server: RunningServer,
    batch: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server stops answering after 120 settles: exit 3, the summary says what
    was done; the same command again settles the rest, and only the rest."""
    real = Remote.call
    settles = itertools.count(1)
    lock = threading.Lock()

    def failing(self: Remote, kind: str, data: dict[str, Any]) -> tuple[int, Any]:
        if kind == "promise.settle":
            with lock:
                n = next(settles)
            if n > 120:
                raise Unreachable(f"{self.server} did not answer: connection refused")
        return real(self, kind, data)

    monkeypatch.setattr(Remote, "call", failing)
    code, out, _ = cli(
        server, capsys, monkeypatch, "promises", "reject", *FILTERS, "--yes", "--json"
    )
    summary = json.loads(out)
    assert code == 3
    assert (summary["settled"], summary["complete"]) == (120, False)
    assert "did not answer" in summary["stopped"]
    assert sum(state(server, id) == "rejected" for id in batch) == 120

    monkeypatch.setattr(Remote, "call", real)
    code, out, _ = cli(
        server, capsys, monkeypatch, "promises", "reject", *FILTERS, "--yes", "--json"
    )
    summary = json.loads(out)
    assert code == 0
    assert (summary["matched"], summary["settled"], summary["complete"]) == (130, 130, True)
    assert states(server, batch) == {"rejected"}


def test_without_a_terminal_it_wants_yes_and_on_one_it_asks(
    server: RunningServer,
    batch: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = server.snap()
    code, out, err = cli(server, capsys, monkeypatch, "promises", "cancel", *FILTERS)
    assert (code, out) == (2, "")
    assert "pass --yes" in err
    code, out, err = cli(
        server, capsys, monkeypatch, "promises", "cancel", *FILTERS, stdin=Terminal("n\n")
    )
    assert (code, out) == (0, "")
    assert err.startswith("Settle 250 promises as rejected_canceled? [y/N] ")
    assert server.snap() == before
    code, out, err = cli(
        server, capsys, monkeypatch, "promises", "cancel", *FILTERS, stdin=Terminal("y\n")
    )
    assert code == 0, err
    assert states(server, batch) == {"rejected_canceled"}


def test_bad_usage_exits_2_and_sends_nothing(
    server: RunningServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    create(server, "p", BATCH_7)
    before = server.snap()
    for argv, why in (
        (("promises", "cancel", "p", "--tags", '{"batch": "7"}', "--yes"), "not both"),
        (("promises", "cancel", "p", "--state", "pending"), "not both"),
        (("promises", "resolve", "--yes"), "give a promise ID, or filters"),
        (("promises", "reject", "--state", "resolved", "--yes"), "cannot be settled again"),
        (("promises", "cancel", "p", "--dry-run"), "--dry-run goes with filters"),
        (("promises", "cancel", "--tags", "[1]", "--yes"), "--tags must be a JSON object"),
    ):
        code, out, err = cli(server, capsys, monkeypatch, *argv)
        assert (code, out) == (2, ""), argv
        assert err.startswith("troth: ") and why in err, (argv, err)
    assert server.snap() == before


# -- with auth on: a prefix token --------------------------------------------------------------


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
        server.client.headers["Authorization"] = f"Bearer {ADMIN}"
        yield server


@pytest.fixture
def tenants(authed: RunningServer) -> RunningServer:
    """Pending promises of two tenants, ``a.`` and ``b.``."""
    authed.reset()
    for id in ("a.1", "a.2", "a.3", "b.1", "b.2"):
        create(authed, id)
    return authed


def test_a_prefix_token_settles_only_under_its_prefix(
    tenants: RunningServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = cli(
        tenants, capsys, monkeypatch, "promises", "cancel", "--state", "pending", "--yes",
        "--json", "-T", A,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["settled"] == 3
    assert states(tenants, ["a.1", "a.2", "a.3"]) == {"rejected_canceled"}
    assert states(tenants, ["b.1", "b.2"]) == {"pending"}
    # Asking for another tenant's prefix: the search itself is refused.
    code, out, err = cli(
        tenants, capsys, monkeypatch, "promises", "cancel", "--id-prefix", "b.", "--yes",
        "-T", A,
    )  # fmt: skip
    assert (code, out) == (1, "")
    assert "promise.search refused: 403" in err
    assert states(tenants, ["b.1", "b.2"]) == {"pending"}


def test_a_settle_the_server_refuses_is_reported_and_exits_1(
    tenants: RunningServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search that shows a promise the token may not settle (troth narrows the
    search to the token's prefix, so ``b.1`` is slipped into its answers here): the
    server's 403 for it is in the summary, the run ends, the rest is settled."""
    real = Remote.call

    def showing_b1(self: Remote, kind: str, data: dict[str, Any]) -> tuple[int, Any]:
        status, body = real(self, kind, data)
        if kind == "promise.search" and "cursor" not in data:
            body["promises"].insert(0, {"id": "b.1", "state": "pending"})
        return status, body

    monkeypatch.setattr(Remote, "call", showing_b1)
    code, out, err = cli(
        tenants, capsys, monkeypatch, "promises", "cancel", "--state", "pending", "--yes",
        "-T", A,
    )  # fmt: skip
    assert code == 1, err
    lines = out.splitlines()
    assert "settled as rejected_canceled  3" in lines
    assert "refused                       1" in lines
    refusal = lines[lines.index("refused:") + 1].split(None, 2)
    assert refusal[:2] == ["b.1", "403"] and "not under the token's prefix" in refusal[2]
    assert states(tenants, ["a.1", "a.2", "a.3"]) == {"rejected_canceled"}
    assert state(tenants, "b.1") == "pending"
