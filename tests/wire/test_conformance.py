"""Replay the shared conformance corpus (observational tier) against a live server.

The corpus (``shared/conformance/corpus``, beside the repository) holds test vectors
generated from the formal specification's Go port; each case is a run of external
requests with the answers the reference machine gave.  Replaying them over a real
socket, on both backends, is the closest thing we have to an external judge of the
protocol, so every case runs and none is skipped.

Replay rule (``shared/conformance/README.md``): before each request, ``debug.tick`` at
its ``now`` so every internal step due by then has fired, then send the request with
``resonate:debug_time = now``.  Statuses must match; 200/300 bodies must match field
for field except ``preload`` (the corpus never fills it) and the inner ``head`` of a
``task.fence`` action (troth's carries corrId/version too).  Error bodies are not
compared (troth answers a message string, the corpus ``{}``).

The ``.driven.ndjson`` twin of each case also lists the internal steps the reference
fired and the outbox messages they sent.  We tick at those instants too (a server that
runs its own loop would have fired them by then) and afterwards require every listed
message to be in ``debug.snap``'s outbox - inclusion only, since troth fires steps
eagerly and may hold later re-dispatches.

Task-facing answers may legitimately show a later stage of the wake pipeline than the
recording (troth is at quiescence at every observation).  Such cases are listed in
``helpers.conformance_cases.AT_QUIESCENCE`` with a reason and the answer expected *after* the
step; troth must give exactly that answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from helpers.conformance_cases import AT_QUIESCENCE
from helpers.support import RunningServer

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "conformance" / "corpus"
MISSING = "corpus-missing"


def case_stems() -> list[str]:
    """Every case in the corpus, by file stem; a sentinel when the corpus is absent.

    A missing corpus must fail the run (CI forgot to place ``shared/`` beside the repo),
    not shrink it to zero tests, so the sentinel becomes one failing test.
    """
    if not CORPUS.is_dir():
        return [MISSING]
    stems = sorted(p.name.removesuffix(".json") for p in CORPUS.glob("*.json"))
    return stems or [MISSING]


def strip_preload(value: Any) -> Any:
    """``value`` without any ``preload`` key at any depth (troth fills it, the corpus never)."""
    if isinstance(value, dict):
        return {k: strip_preload(v) for k, v in value.items() if k != "preload"}
    if isinstance(value, list):
        return [strip_preload(v) for v in value]
    return value


def comparable(kind: str, data: Any) -> Any:
    """The part of a 200/300 body the corpus pins down.

    For ``task.fence`` the inner action is reduced to ``kind``, ``head.status`` and
    ``data``: troth's inner head also carries corrId/version, which the corpus omits.
    """
    data = strip_preload(data)
    if kind == "task.fence" and isinstance(data, dict) and isinstance(data.get("action"), dict):
        action = data["action"]
        data = {
            **data,
            "action": {
                "kind": action.get("kind"),
                "head": {"status": action.get("head", {}).get("status")},
                "data": action.get("data"),
            },
        }
    return data


@dataclass
class Replay:
    """What a replay observed: answers per external row, and the records last seen."""

    answers: list[tuple[int, Any]] = field(default_factory=list)
    promises: dict[str, dict[str, Any]] = field(default_factory=dict)

    def remember(self, data: Any) -> None:
        """Keep the latest promise record per id (the unblock check compares against it)."""
        if not isinstance(data, dict):
            return
        promise = data.get("promise")
        if isinstance(promise, dict) and "id" in promise:
            self.promises[promise["id"]] = strip_preload(promise)
        action = data.get("action")
        if isinstance(action, dict):
            self.remember(action.get("data"))


def load(path: Path) -> list[dict[str, Any]]:
    """The rows of one ``.ndjson`` file, in order."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def replay(server: RunningServer, rows: list[dict[str, Any]]) -> Replay:
    """Tick at every row's instant and send the external rows; collect the answers.

    ``tau.*`` rows are ticked too: they mark instants where the reference fired a step,
    and a trailing one (e.g. the retry in case 250) is the only way its outbox message
    can be due before we snap.
    """
    seen = Replay()
    for row in rows:
        server.tick(row["now"])
        if row["kind"].startswith("tau."):
            continue
        status, data = server.call(row["kind"], row["req"], row["now"])
        seen.answers.append((status, data))
        if status in (200, 300):
            seen.remember(data)
    return seen


def check_answers(stem: str, rows: list[dict[str, Any]], seen: Replay) -> None:
    """Every external answer against the recording (or its at-quiescence override)."""
    overrides = AT_QUIESCENCE[stem].expected if stem in AT_QUIESCENCE else {}
    external = [r for r in rows if not r["kind"].startswith("tau.")]
    failures: list[str] = []
    for i, (row, (status, data)) in enumerate(zip(external, seen.answers, strict=True)):
        want_status, want_data = overrides.get(
            i, (row["res"]["head"]["status"], row["res"]["data"])
        )
        where = f"line {i + 1} {row['kind']} now={row['now']} req={json.dumps(row['req'])}"
        if status != want_status:
            failures.append(f"{where}: status {status}, expected {want_status} ({data!r})")
        elif status in (200, 300):
            got, want = comparable(row["kind"], data), comparable(row["kind"], want_data)
            if got != want:
                failures.append(
                    f"{where}:\n  got      {json.dumps(got)}\n  expected {json.dumps(want)}"
                )
    assert not failures, f"{stem}:\n" + "\n".join(failures)


def check_outbox(stem: str, rows: list[dict[str, Any]], seen: Replay, snap: dict[str, Any]) -> None:
    """Every message the reference sent is in troth's outbox (inclusion only).

    Execute rows are keyed by task id and coalesce to the latest version, so troth's
    version may be newer than the recorded one but never older.  Unblock rows carry the
    promise record; it must be the settled record the replay last observed.
    """
    by_key = {row["key"]: row for row in snap["outbox"]}
    failures: list[str] = []
    for row in rows:
        for msg in row.get("msg", []):
            if msg["kind"] == "execute":
                key = msg["taskId"]
            else:
                key = f"{msg['promise']}:notify:{msg['address']}"
            got = by_key.get(key)
            where = f"{row['kind']} now={row['now']} sent {json.dumps(msg)}"
            if got is None:
                failures.append(f"{where}: no outbox row {key!r} in {sorted(by_key)}")
                continue
            message = got["message"]
            if got["address"] != msg["address"] or message["kind"] != msg["kind"]:
                failures.append(f"{where}: outbox row {json.dumps(got)}")
            elif msg["kind"] == "execute":
                if message["taskId"] != msg["taskId"] or message["version"] < msg["version"]:
                    failures.append(f"{where}: outbox row {json.dumps(got)}")
            else:
                record = strip_preload(message["promise"])
                want = seen.promises.get(msg["promise"])
                if record.get("id") != msg["promise"] or record.get("state") == "pending":
                    failures.append(f"{where}: unblock carries {json.dumps(record)}")
                elif want is not None and want["state"] != "pending" and record != want:
                    failures.append(
                        f"{where}: unblock carries {json.dumps(record)}, "
                        f"last observed {json.dumps(want)}"
                    )
    assert not failures, f"{stem}:\n" + "\n".join(failures)


def test_corpus_is_present() -> None:
    """The corpus sits beside the repository; without it the conformance run is void."""
    assert CORPUS.is_dir(), f"conformance corpus not found at {CORPUS}"
    assert list(CORPUS.glob("*.json")), f"conformance corpus at {CORPUS} is empty"


def test_quiescence_overrides_are_live() -> None:
    """A stale override must not linger unnoticed.

    Each one must name a corpus case, point at an external row, and actually differ
    from the recording there; an override equal to the recording (e.g. after the corpus
    is regenerated with the step fired) would silently hide nothing and mean nothing.
    """
    problems: list[str] = []
    for stem, quiescent in AT_QUIESCENCE.items():
        path = CORPUS / f"{stem}.driven.ndjson"
        if not path.exists():
            problems.append(f"{stem}: not in the corpus")
            continue
        external = [r for r in load(path) if not r["kind"].startswith("tau.")]
        for i, (status, data) in quiescent.expected.items():
            if not 0 <= i < len(external):
                problems.append(f"{stem}: row {i} out of range")
                continue
            row = external[i]
            recorded = (row["res"]["head"]["status"], row["res"]["data"])
            same_status = status == recorded[0]
            if same_status and (
                status not in (200, 300)
                or comparable(row["kind"], data) == comparable(row["kind"], recorded[1])
            ):
                problems.append(f"{stem}: row {i} override equals the recording")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("stem", case_stems())
def test_case(server: RunningServer, stem: str) -> None:
    """Replay one corpus case; compare every answer, then the outbox."""
    assert stem != MISSING, f"conformance corpus not found at {CORPUS}"
    driven = CORPUS / f"{stem}.driven.ndjson"
    observed = CORPUS / f"{stem}.ndjson"
    rows = load(driven)
    if observed.exists():
        # The driven file must be the observed run with steps interleaved; otherwise
        # replaying it would not be replaying the case.
        external = [
            {k: v for k, v in r.items() if k != "msg"}
            for r in rows
            if not r["kind"].startswith("tau.")
        ]
        assert external == load(observed), f"{stem}: .driven.ndjson and .ndjson disagree"
    seen = replay(server, rows)
    check_answers(stem, rows, seen)
    check_outbox(stem, rows, seen, server.snap())
