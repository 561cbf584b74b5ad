"""How troth's help reads in a terminal: examples kept line for line, paragraphs
wrapped to the terminal, defaults in plain words."""

from __future__ import annotations

import argparse


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
