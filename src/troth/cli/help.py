"""How troth's help reads in a terminal: examples kept line for line, paragraphs
wrapped to the terminal, defaults in plain words; and the client commands'
examples (their epilogs)."""

from __future__ import annotations

import argparse
from typing import Final


class Formatter(argparse.HelpFormatter):
    """A description or epilog written on several lines (examples, lists) is shown as
    written, wrapped by hand to 80 columns; one written on one line is a paragraph,
    wrapped to the terminal.  Options' help is wrapped as usual."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30)

    def _format_action(self, action: argparse.Action) -> str:
        text = super()._format_action(action)
        if action.nargs == argparse.PARSER:
            # The commands' list without its "COMMAND" heading line: the group's title
            # ("commands:", "actions:") already says what follows.
            text = text.split("\n", 1)[1]
        return text

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def default_text(value: object) -> str:
    """A setting's default as its help and the README show it: ``on``/``off`` for a
    switch, ``none`` for an empty text, ``5`` rather than ``5.0``."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == "":
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# -- the client commands' examples --------------------------------------------

PROMISES_EPILOG: Final = """\
examples:
  troth promises get order-42
  troth promises search --state pending --tags '{"resonate:origin": "order-42"}'
  troth promises create approval-7 --timeout 1h
  troth promises resolve approval-7 --value '{"data": {"ok": true}}'
  troth promises cancel --state pending --tags '{"batch": "7"}' --dry-run
  troth promises get order-42 --json"""

SETTLE_EPILOG: Final = """\
With filters instead of an ID it settles every pending promise the search finds
(promise.search, a page of 100 at a time): it counts them first, --dry-run shows
the count and the first ids and changes nothing, and it asks before settling
unless --yes. A settled promise stays settled, so running the same command again
after an interruption settles the rest. Progress goes to stderr, a summary to
stdout (--json: as JSON); exit 1 if the server refused any of them.

examples:
  troth promises {verb} approval-7
  troth promises {verb} --state pending --tags '{{"batch": "7"}}' --dry-run
  troth promises {verb} --id-prefix import-2026-03/ --yes"""

TASKS_EPILOG: Final = """\
examples:
  troth tasks get order-42
  troth tasks search --state acquired
  troth tasks acquire order-42 --pid worker-1 --version 1 --ttl 15s
  troth tasks release order-42 --version 1"""

SCHEDULES_EPILOG: Final = """\
examples:
  troth schedules create nightly --cron "0 3 * * *" \\
      --promise-id "report.{{.timestamp}}" --promise-timeout 1h
  troth schedules get nightly
  troth schedules delete nightly"""

INVOKE_EPILOG: Final = """\
examples:
  troth invoke process_order --id order-43 --arg 43 --target poll://any@workers
  troth invoke report --id report-1 --json-args '[2026, "q4"]' --delay 5m"""

TREE_EPILOG: Final = """\
examples:
  troth tree order-42
  troth tree order-42 --all      every settled sibling, none folded"""

EXPLAIN_EPILOG: Final = """\
Walks from the workflow down to what holds it back (a task nobody acquired, a
worker group with no worker, a delivery that failed) and says why, one line
each. It needs a troth server (its operator API, GET /ops/explain).

examples:
  troth explain order-42
  troth explain order-42 --json"""

WORKERS_EPILOG: Final = """\
It needs a troth server (its operator API, GET /ops/workers).

examples:
  troth workers
  troth workers --server http://troth.internal:8001"""

OUTBOX_EPILOG: Final = """\
It needs a troth server (its operator API, GET /ops/outbox). `troth outbox
retry` offers the deliveries that failed for good again, with fresh attempts
(POST /ops/outbox/retry): the newest of each message, unless its task is no
longer pending or a newer message of its key was written.

examples:
  troth outbox --state failed
  troth outbox --task order-42
  troth outbox --limit 20 --before 1234
  troth outbox retry --target payments --since 1h --dry-run
  troth outbox retry --target https://hooks.example.com/resonate"""

CANCEL_EPILOG: Final = """\
Settles every pending promise of the workflow rooted at ID (the root, and every
promise tagged resonate:origin = ID) as rejected_canceled, oldest first, in
transactions of bounded size. Their tasks end; workers holding them are refused
at their next request. Run it again to finish a cancel that was cut short: only
what is still pending is settled. It needs a troth server (POST /ops/cancel).

examples:
  troth cancel order-42 --reason "customer withdrew"
  troth cancel order-42 --json"""
