"""``troth limits``: the concurrency and rate limits of worker groups (flow control,
``POST /ops/limits/…`` and ``GET /ops/limits``, server/operator/actions.py), for people or
as JSON with ``--json``."""

from __future__ import annotations

import argparse
from typing import Any, Final

from troth.cli.remote import Remote, RemoteError
from troth.cli.render import Renderer
from troth.flow.limits import parse_rate, rate_text

KIND: Final = "limits"
ACTIONS: Final = ("set", "get", "list", "delete")

EPILOG: Final = """\
examples:
  troth limits set payments --concurrency 5  # 5 of group payments at once
  troth limits set llm --rate 10/s           # 10 starts a second, one at a time
  troth limits set llm --rate 600/m --burst 20 --concurrency 8
  troth limits set reports --concurrency 10 --per-key 2  # 2 per troth:key
  troth limits list                          # slots in use, tasks held
  troth limits get payments --json
  troth limits set https://api.example.com --rate 50/s  # pushes to a host
  troth limits delete payments               # held tasks go at once

A group is the one of poll://any@GROUP and poll://uni@GROUP/..., or a push
target: https://host[:port] or nats://subject.  A task beyond the limit
stays pending and gets its execute when a slot frees and the rate allows
(docs/operations.md, "Flow control")."""


class Usage(Exception):
    """A command line that does not make a limits request."""


def build(a: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The request ``troth limits ...`` makes: its action and body."""
    caps = (
        ("concurrency", a.concurrency),
        ("rate", a.rate),
        ("burst", a.burst),
        ("perKey", a.per_key),
    )
    given = {k: v for k, v in caps if v is not None}
    if a.action == "list":
        if a.group or given:
            raise Usage("limits list takes no group and no limit")
        return KIND, {"action": "list"}
    if not a.group:
        raise Usage(f"limits {a.action} needs a GROUP")
    if a.action == "set":
        if not given.keys() & {"concurrency", "rate", "perKey"}:
            raise Usage("limits set needs --concurrency N, --rate R/s or --per-key N")
        if "burst" in given and "rate" not in given:
            raise Usage("--burst goes with --rate")
        if "rate" in given:
            try:
                parse_rate(given["rate"])
            except ValueError as exc:
                raise Usage(str(exc)) from None
        return KIND, {"action": "set", "group": a.group, **given}
    if given:
        raise Usage(f"limits {a.action} takes no limit, only a GROUP")
    return KIND, {"action": a.action, "group": a.group}


def show(remote: Remote, r: Renderer, data: dict[str, Any]) -> None:
    action = data["action"]
    if action == "set":
        body = {k: v for k, v in data.items() if k != "action"}
        answer = remote.action("limits/set", body)
        if r.as_json:
            r.json(answer)
            return
        print(_line(answer), file=r.out)
        if answer["admitted"]:
            print(f"  {answer['admitted']} held tasks let through", file=r.out)
        return
    if action == "delete":
        answer = remote.action("limits/delete", {"group": data["group"]})
        if r.as_json:
            r.json(answer)
            return
        print(
            f"{answer['group']}: no limit; {answer['admitted']} held tasks let through", file=r.out
        )
        return
    found = remote.operator("limits", {})["limits"]
    if action == "get":
        found = [x for x in found if x["group"] == data["group"]]
        if not found:
            raise RemoteError("limits", 404, f"group {data['group']!r} has no limit")
        if r.as_json:
            r.json(found[0])
            return
    elif r.as_json:
        r.json(found)
        return
    if not found:
        print("no limits", file=r.out)
    for limit in found:
        print(_line(limit), file=r.out)


def _line(limit: dict[str, Any]) -> str:
    caps = []
    if limit.get("concurrency") is not None:
        caps.append(f"concurrency {limit['concurrency']}")
    if limit.get("rate") is not None:
        caps.append(f"rate {rate_text(limit['rate'])} burst {limit.get('burst', 1)}")
    if limit.get("perKey") is not None:
        caps.append(f"per key {limit['perKey']}")
    return f"{limit['group']}: {', '.join(caps)} ({limit['inUse']} in use, {limit['held']} held)"
