"""Human-readable output of the client commands: aligned fields and tables, times
both relative and absolute, payloads decoded, colour only on a terminal."""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any, Final, TextIO

from troth.ops.times import instant, relative, span

_STATE_COLOURS: Final = {
    "pending": "33",  # yellow
    "acquired": "36",  # cyan
    "suspended": "35",  # magenta
    "resolved": "32",  # green
    "fulfilled": "32",
    "rejected": "31",  # red
    "rejected_canceled": "31",
    "rejected_timedout": "31",
    "halted": "31",
}
_ANSI: Final = re.compile(r"\x1b\[[0-9;]*m")


def colour_wanted(out: TextIO) -> bool:
    """Colour on a terminal unless ``NO_COLOR`` is set (https://no-color.org)."""
    return out.isatty() and not os.environ.get("NO_COLOR")


def paint(text: str, state: str, colour: bool) -> str:
    code = _STATE_COLOURS.get(state)
    return f"\x1b[{code}m{text}\x1b[0m" if colour and code else text


def payload(value: Any) -> str:
    """A value as the SDKs send it (base64 ``data``, often JSON), decoded for reading."""
    if not isinstance(value, dict) or value.get("data") is None:
        headers = value.get("headers") if isinstance(value, dict) else None
        return f"headers={json.dumps(headers)}" if headers else "-"
    data = value["data"]
    try:
        text = base64.b64decode(str(data), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return str(data)
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        return text


def fields(rows: Sequence[tuple[str, str]], out: TextIO) -> None:
    width = max((len(k) for k, _ in rows), default=0)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}", file=out)


def table(head: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO, plain: Any) -> None:
    """Columns aligned on the text without colour codes (``plain`` strips them)."""
    widths = [len(h) for h in head]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(plain(cell)))
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip(), file=out)
    for row in rows:
        cells = [c + " " * (w - len(plain(c))) for c, w in zip(row, widths, strict=True)]
        print("  ".join(cells).rstrip(), file=out)


class Renderer:
    """Prints what a command got back, for people or (``--json``) for scripts."""

    def __init__(self, out: TextIO = sys.stdout, *, as_json: bool = False) -> None:
        self.out = out
        self.as_json = as_json
        self.colour = colour_wanted(out) and not as_json
        self.now = time.time_ns() // 1_000_000

    def plain(self, text: str) -> str:
        return _ANSI.sub("", text) if "\x1b[" in text else text

    def state(self, state: str) -> str:
        return paint(state, state, self.colour)

    def json(self, data: Any) -> None:
        print(json.dumps(data, indent=2, ensure_ascii=False), file=self.out)

    def show(self, kind: str, data: Any) -> None:
        """Whatever ``kind`` answered: a promise, a task, a schedule or a page of them."""
        if self.as_json or not isinstance(data, dict):
            self.json(data)
            return
        if "promises" in data:
            self.promises(data["promises"], data.get("cursor"))
        elif "tasks" in data:
            self.tasks(data["tasks"], data.get("cursor"))
        elif "schedules" in data:
            self.schedules(data["schedules"], data.get("cursor"))
        else:
            shown = False
            if isinstance(data.get("promise"), dict):
                self.promise(data["promise"])
                shown = True
            if isinstance(data.get("task"), dict):
                if shown:
                    print(file=self.out)
                self.task(data["task"])
                shown = True
            if isinstance(data.get("schedule"), dict):
                self.schedule(data["schedule"])
                shown = True
            if not shown:
                print(f"{kind}: ok" if not data else json.dumps(data), file=self.out)

    def promise(self, p: dict[str, Any]) -> None:
        tags = p.get("tags") or {}
        rows = [
            ("id", str(p.get("id"))),
            ("state", self.state(str(p.get("state")))),
            ("timeout", instant(p.get("timeoutAt"), self.now)),
            ("created", instant(p.get("createdAt"), self.now)),
            ("settled", instant(p.get("settledAt"), self.now)),
            ("param", payload(p.get("param"))),
            ("value", payload(p.get("value"))),
        ]
        rows += [(f"tag {k}", v) for k, v in sorted(tags.items())]
        fields(rows, self.out)

    def task(self, t: dict[str, Any]) -> None:
        rows = [
            ("task", str(t.get("id"))),
            ("state", self.state(str(t.get("state")))),
            ("version", str(t.get("version"))),
            ("pid", str(t.get("pid", "-"))),
            ("ttl", span(int(t["ttl"])) if isinstance(t.get("ttl"), int) else "-"),
            ("resumes", str(t.get("resumes", 0))),
        ]
        fields(rows, self.out)

    def schedule(self, s: dict[str, Any]) -> None:
        rows = [
            ("id", str(s.get("id"))),
            ("cron", str(s.get("cron"))),
            ("promise id", str(s.get("promiseId"))),
            ("promise timeout", span(int(s.get("promiseTimeout", 0)))),
            ("next run", instant(s.get("nextRunAt"), self.now)),
            ("last run", instant(s.get("lastRunAt"), self.now)),
            ("created", instant(s.get("createdAt"), self.now)),
        ]
        rows += [(f"tag {k}", v) for k, v in sorted((s.get("promiseTags") or {}).items())]
        fields(rows, self.out)

    def promises(self, items: list[dict[str, Any]], cursor: str | None) -> None:
        rows = [
            [
                str(p.get("id")),
                self.state(str(p.get("state"))),
                relative(int(p.get("createdAt", self.now)), self.now),
                instant(p.get("timeoutAt"), self.now).split(" (")[-1].rstrip(")"),
            ]
            for p in items
        ]
        table(["ID", "STATE", "CREATED", "TIMEOUT"], rows, self.out, self.plain)
        self.more(len(items), cursor)

    def tasks(self, items: list[dict[str, Any]], cursor: str | None) -> None:
        rows = [
            [
                str(t.get("id")),
                self.state(str(t.get("state"))),
                str(t.get("version")),
                str(t.get("pid", "-")),
            ]
            for t in items
        ]
        table(["ID", "STATE", "VERSION", "PID"], rows, self.out, self.plain)
        self.more(len(items), cursor)

    def schedules(self, items: list[dict[str, Any]], cursor: str | None) -> None:
        rows = [
            [
                str(s.get("id")),
                str(s.get("cron")),
                relative(int(s.get("nextRunAt", self.now)), self.now),
                str(s.get("promiseId")),
            ]
            for s in items
        ]
        table(["ID", "CRON", "NEXT RUN", "PROMISE ID"], rows, self.out, self.plain)
        self.more(len(items), cursor)

    def more(self, shown: int, cursor: str | None) -> None:
        note = f"{shown} shown"
        if cursor:
            note += f"; more with --cursor {cursor}"
        print(f"({note})", file=self.out)
