"""Settling every promise a search finds: ``troth promises cancel|resolve|reject``
with filters (``--state pending``, ``--tags``, ``--id-prefix``) instead of an ID.

It speaks the protocol only, as any remote client does: ``promise.search`` to find
the pending promises (paged by its cursor), then one ``promise.settle`` each.  First
it counts them (``--dry-run`` stops there and shows the first ids), asks for a
confirmation unless ``--yes``, then settles a page at a time and says how far it got.

Resumable: a settle is idempotent (a settled promise answers 200 with its state, and
is no longer found as pending), so running the same command again after an
interruption settles what is left.  Settling changes what the search finds, so no
page is trusted to be the whole rest: after following the cursor to the end, it
searches again from the start, and stops when a whole pass finds nothing it has not
already tried (a refused promise stays pending and is found again, but is tried only
once).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Final, TextIO

import httpx

from troth.cli.remote import Remote, RemoteError, Unreachable
from troth.cli.render import fields

#: ``run_client``'s request kind for a bulk settle (not a protocol kind).
KIND: Final = "promise.settle.bulk"
#: Promises searched, then settled, at a time.
BATCH: Final = 100
#: Promises per search page while counting (the protocol's largest page).
COUNT_PAGE: Final = 1000
#: Ids a dry run shows; refusals and failures listed for people.
SHOWN: Final = 20
LISTED: Final = 10
#: Settles in flight at once.
PARALLEL: Final = 8

EXIT_REFUSED: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3


def misuse(a: argparse.Namespace) -> str | None:
    """Why the settle command's flags cannot be used together, or None."""
    filtered = a.state is not None or a.tags is not None or a.id_prefix is not None
    if a.id is not None and filtered:
        return "give a promise ID or filters (--state, --tags, --id-prefix), not both"
    if a.id is None and not filtered:
        return (
            "give a promise ID, or filters (--state pending, --tags, --id-prefix) "
            "to settle every pending promise they find"
        )
    if a.state is not None and a.state != "pending":
        return (
            f"--state {a.state}: only pending promises can be settled (a settled "
            "promise cannot be settled again); use --state pending"
        )
    if a.id is not None and a.dry_run:
        return "--dry-run goes with filters (--state, --tags, --id-prefix), not with an ID"
    return None


def job(
    state: str, value: dict[str, Any], tags: dict[str, str] | None, prefix: str | None
) -> dict[str, Any]:
    """The request data ``run`` gets: the target state and value, and the search."""
    search: dict[str, Any] = {"state": "pending"}
    if tags:
        search["tags"] = tags
    if prefix:
        search["idPrefix"] = prefix
    return {"state": state, "value": value, "search": search}


@dataclass(frozen=True)
class Problem:
    """A promise not settled: the server's status (None: no answer) and message."""

    id: str
    status: int | None
    message: str

    def record(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "message": self.message}


@dataclass
class Summary:
    """What a run did so far."""

    state: str
    matched: int
    settled: int = 0
    already: int = 0
    refused: list[Problem] = field(default_factory=list)
    failed: list[Problem] = field(default_factory=list)
    #: Why the run stopped before the end (the search refused, no answer), or None.
    stopped: str | None = None
    unreachable: bool = False

    def done(self) -> int:
        return self.settled + self.already + len(self.refused) + len(self.failed)

    def code(self) -> int:
        if self.unreachable:
            return EXIT_UNREACHABLE
        return EXIT_REFUSED if self.refused or self.failed or self.stopped else 0

    def record(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "matched": self.matched,
            "settled": self.settled,
            "alreadySettled": self.already,
            "refused": [p.record() for p in self.refused],
            "failed": [p.record() for p in self.failed],
            "complete": self.stopped is None,
            **({"stopped": self.stopped} if self.stopped else {}),
        }

    def progress(self) -> str:
        line = f"settled {self.settled + self.already} of ~{self.matched}"
        if self.refused:
            line += f", {len(self.refused)} refused"
        if self.failed:
            line += f", {len(self.failed)} failed"
        return line

    def show(self, out: TextIO) -> None:
        fields(
            [
                (f"settled as {self.state}", str(self.settled)),
                ("already settled", str(self.already)),
                ("refused", str(len(self.refused))),
                ("failed", str(len(self.failed))),
            ],
            out,
        )
        for name, problems in (("refused", self.refused), ("failed", self.failed)):
            if problems:
                print(f"{name}:", file=out)
            for p in problems[:LISTED]:
                print(f"  {p.id}  {p.status or '-'} {p.message}", file=out)
            if len(problems) > LISTED:
                print(f"  … and {len(problems) - LISTED} more (--json lists all)", file=out)
        if self.stopped is not None:
            print(f"stopped: {self.stopped}", file=out)
        if self.stopped is not None or self.failed:
            print("run the same command again to settle the rest", file=out)


def pages(remote: Remote, search: dict[str, Any], limit: int) -> Iterator[list[str]]:
    """One pass over the search, page by page: the ids of each page's pending
    promises.  Raises :class:`RemoteError` (the search refused) or
    :class:`Unreachable`."""
    cursor: str | None = None
    while True:
        data = {**search, "limit": limit, **({"cursor": cursor} if cursor else {})}
        answer = remote.ok("promise.search", data)
        found = answer.get("promises", []) if isinstance(answer, dict) else []
        yield [str(p["id"]) for p in found if p.get("state", "pending") == "pending"]
        after = answer.get("cursor") if isinstance(answer, dict) else None
        if not after or after == cursor:
            return
        cursor = after


def count(remote: Remote, search: dict[str, Any]) -> tuple[int, list[str]]:
    """How many promises the search finds now, and the first :data:`SHOWN` ids."""
    total, first = 0, list[str]()
    for ids in pages(remote, search, COUNT_PAGE):
        total += len(ids)
        first.extend(ids[: SHOWN - len(first)])
    return total, first


def settle_one(remote: Remote, state: str, value: dict[str, Any], id: str) -> tuple[str, Problem]:
    """``(outcome, problem)``: outcome is settled, already, refused, failed or
    unreachable; the problem says why for the last three."""
    try:
        status, body = remote.call("promise.settle", {"id": id, "state": state, "value": value})
    except Unreachable as exc:
        return "unreachable", Problem(id, None, str(exc))
    message = body if isinstance(body, str) else str(body)
    if 400 <= status < 500:
        return "refused", Problem(id, status, message)
    promise = body.get("promise") if isinstance(body, dict) else None
    now = promise.get("state") if isinstance(promise, dict) else None
    if status != 200 or now is None or now == "pending":
        return "failed", Problem(id, status, message)
    return ("settled" if now == state else "already"), Problem(id, status, str(now))


def settle_all(remote: Remote, data: dict[str, Any], summary: Summary, err: TextIO) -> None:
    """Settle a page at a time until a whole pass of the search finds nothing new."""
    tried: set[str] = set()
    loud = summary.matched > BATCH
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        while True:
            new = 0
            for ids in pages(remote, data["search"], BATCH):
                fresh = [i for i in ids if i not in tried]
                tried.update(fresh)
                new += len(fresh)
                outcomes = pool.map(
                    lambda i: settle_one(remote, data["state"], data["value"], i), fresh
                )
                for outcome, problem in outcomes:
                    if outcome == "settled":
                        summary.settled += 1
                    elif outcome == "already":
                        summary.already += 1
                    elif outcome == "refused":
                        summary.refused.append(problem)
                    else:
                        summary.failed.append(problem)
                        if outcome == "unreachable":
                            summary.unreachable = True
                            summary.stopped = problem.message
                if loud and fresh:
                    print(summary.progress(), file=err, flush=True)
                if summary.unreachable:
                    return
            if new == 0:
                return


def confirmed(n: int, state: str, stdin: TextIO, err: TextIO) -> bool:
    print(f"Settle {n} promises as {state}? [y/N] ", end="", file=err, flush=True)
    return stdin.readline().strip().lower() in ("y", "yes")


def show_dry_run(state: str, matched: int, first: list[str], out: TextIO, *, as_json: bool) -> None:
    if as_json:
        shown = {"dryRun": True, "state": state, "matched": matched, "ids": first}
        print(json.dumps(shown, indent=2), file=out)
        return
    print(f"dry run, nothing changed: {matched} pending promises found", file=out)
    for id in first:
        print(f"  {id}", file=out)
    if matched > len(first):
        print(f"  … and {matched - len(first)} more", file=out)


def run(remote: Remote, data: dict[str, Any], a: argparse.Namespace) -> int:
    """Count, show (``--dry-run``), confirm (unless ``--yes``), settle; the exit code."""
    out, err, stdin = sys.stdout, sys.stderr, sys.stdin
    state = data["state"]
    if not a.dry_run and not a.yes and not stdin.isatty():
        print("troth: not a terminal, cannot ask: pass --yes to settle without asking", file=err)
        return EXIT_USAGE
    with httpx.Client() as http:
        remote = replace(remote, http=http)
        try:
            matched, first = count(remote, data["search"])
        except RemoteError as exc:
            print(f"troth: {exc.kind} refused: {exc.status} {exc.message}", file=err)
            return EXIT_REFUSED
        except Unreachable as exc:
            print(f"troth: {exc}", file=err)
            return EXIT_UNREACHABLE
        if a.dry_run:
            show_dry_run(state, matched, first, out, as_json=a.json)
            return 0
        if matched and not a.yes and not confirmed(matched, state, stdin, err):
            print("nothing changed", file=err)
            return 0
        summary = Summary(state, matched)
        try:
            if matched:  # none found, none confirmed: nothing is settled
                settle_all(remote, data, summary, err)
        except RemoteError as exc:
            summary.stopped = f"{exc.kind} refused: {exc.status} {exc.message}"
        except Unreachable as exc:
            summary.stopped, summary.unreachable = str(exc), True
    if a.json:
        print(json.dumps(summary.record(), indent=2), file=out)
    else:
        summary.show(out)
    return summary.code()
