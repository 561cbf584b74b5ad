"""The command line as a newcomer reads it: every help in plain words that fits an
80-column terminal, examples that parse, and ``serve``'s options and the README's
configuration table kept the same (groups, names, defaults)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest

import troth.cli.main
from troth.cli.help import default_text
from troth.cli.main import build_parser
from troth.server.config import Settings

README = Path(__file__).resolve().parents[2] / "README.md"
#: Commands whose help ends with examples.
WITH_EXAMPLES = [
    "",
    "serve",
    "dev",
    "bench",
    "token",
    "backup",
    "migrate-store",
    "promises",
    "tasks",
    "schedules",
    "invoke",
    "tree",
    "explain",
    "workers",
    "outbox",
    "cancel",
    "migrate",
    "mcp",
]


@pytest.fixture(autouse=True)
def eighty_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


def subparsers(p: argparse.ArgumentParser) -> Iterator[argparse._SubParsersAction]:  # type: ignore[type-arg]
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield action


def every_parser(
    p: argparse.ArgumentParser, path: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command and action once (aliases skipped), by its words after ``troth``."""
    yield path, p
    for action in subparsers(p):
        seen: set[int] = set()
        for name, child in action.choices.items():
            if id(child) not in seen:
                seen.add(id(child))
                yield from every_parser(child, f"{path} {name}".strip())


def parser_of(words: str) -> argparse.ArgumentParser:
    return dict(every_parser(build_parser()))[words]


def test_every_help_fits_80_columns_and_speaks_plain_words() -> None:
    checked = 0
    for words, p in every_parser(build_parser()):
        text = p.format_help()
        for line in text.splitlines():
            assert len(line) <= 80, f"troth {words} --help: {line!r}"
        for markup in ("``", ":class:", ":func:", ".py", "troth.cli", "troth.server"):
            assert markup not in text, f"troth {words} --help shows {markup!r}"
        assert p.description, f"troth {words} --help has no description"
        for action in p._actions:
            if action.option_strings or action.dest not in ("command", "action"):
                assert action.help, f"troth {words}: {action.option_strings or action.dest}"
        checked += 1
    assert checked > 35


def test_the_main_help_is_not_the_module_docstring() -> None:
    text = build_parser().format_help()
    assert troth.cli.main.__doc__ is not None
    assert troth.cli.main.__doc__.splitlines()[0] not in text
    assert text.splitlines()[0] == "usage: troth [-h] [--version] COMMAND ..."
    assert "troth is a durable promise server" in text


@pytest.mark.parametrize("words", WITH_EXAMPLES)
def test_examples_are_given_and_each_parses(words: str) -> None:
    p = parser_of(words)
    assert p.epilog is not None and "examples:\n" in p.epilog, words
    examples = p.epilog.split("examples:\n", 1)[1].split("\n\n", 1)[0]
    examples = re.sub(r"\\\n\s*", " ", examples)  # a continued line
    parsed = 0
    for line in examples.splitlines():
        command = re.split(r"\s{3,}", line.strip())[0]  # an example, then what it does
        if "$(troth" in command:  # RESONATE_TOKEN=$(troth token …)
            command = command.split("$(", 1)[1].rstrip(")")
        argv = [w for w in shlex.split(command) if not re.match(r"^[A-Z_]+=", w)]
        assert argv[0] == "troth", line
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"the example does not parse: {line}")
        parsed += 1
    assert parsed >= 1


def test_troth_help_as_a_user_runs_it() -> None:
    env = {**os.environ, "COLUMNS": "80"}
    for argv in (["--help"], ["serve", "--help"], ["promises", "search", "--help"]):
        done = subprocess.run(
            [sys.executable, "-m", "troth.cli.main", *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert max(len(line) for line in done.stdout.splitlines()) <= 80
        assert done.stdout.startswith("usage: troth")


# -- serve's options and the README's configuration table ---------------------------------


def readme_table() -> list[tuple[str, list[tuple[str, str]]]]:
    """The README's configuration table: its sections (bold rows) in order, each with
    its rows as ``(setting, default as shown)``."""
    text = README.read_text()
    start = text.index("| setting | default | meaning |")
    sections: list[tuple[str, list[tuple[str, str]]]] = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0].startswith("**"):
            sections.append((cells[0].strip("*"), []))
            continue
        assert sections, f"a row before any section: {line}"
        sections[-1][1].append((cells[0].strip("`"), cells[1].replace("`", "")))
    return sections


def serve_groups(words: str = "serve") -> list[tuple[str, list[tuple[str, str]]]]:
    """``troth serve``'s option groups in order, each with ``(setting, default as shown)``."""
    groups = []
    for group in parser_of(words)._action_groups:
        if group.title in ("positional arguments", "options"):
            continue
        rows = []
        for action in group._group_actions:
            assert action.help is not None
            shown = re.search(r"\(default: ([^()]*)\)$", action.help)
            assert shown, f"{action.option_strings[0]} does not end with its default"
            assert action.option_strings[0] == "--" + action.dest.replace("_", "-")
            rows.append((action.dest, shown.group(1)))
        groups.append((str(group.title), rows))
    return groups


def test_the_readme_table_has_serves_groups_settings_and_defaults() -> None:
    table, groups = readme_table(), serve_groups()
    assert [t for t, _ in table] == [t for t, _ in groups], "sections differ from --help"
    for (title, rows), (_, options) in zip(table, groups, strict=True):
        assert sorted(rows) == sorted(options), f"section {title}: README vs --help"


def test_every_setting_has_an_option_and_a_row() -> None:
    names = {f.name for f in fields(Settings)}
    options = {name for _, rows in serve_groups() for name, _ in rows}
    listed = [name for _, rows in readme_table() for name, _ in rows]
    assert options == names, f"without an option: {names - options}; unknown: {options - names}"
    assert sorted(listed) == sorted(names), "the README lists a setting twice, or misses one"


@pytest.mark.parametrize("words", ["serve", "dev"])
def test_the_defaults_shown_are_the_settings(words: str) -> None:
    base = Settings() if words == "serve" else troth.cli.main.DEV
    for _, rows in serve_groups(words):
        for name, shown in rows:
            value = getattr(base, name)
            if shown != default_text(value):
                # Worked out at start (server_url, node_id) or a feature that is off.
                assert value == "", f"--{name}: shows {shown!r}, the setting is {value!r}"


def test_a_drift_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The table test fails on a changed default and on a missing row."""
    text = README.read_text()
    changed = tmp_path / "README.md"
    changed.write_text(text.replace("| `port` | `8001` |", "| `port` | `8002` |"))
    monkeypatch.setattr(sys.modules[__name__], "README", changed)
    with pytest.raises(AssertionError, match="section HTTP"):
        test_the_readme_table_has_serves_groups_settings_and_defaults()
    changed.write_text(re.sub(r"\| `nats_prefix` .*\n", "", text))
    with pytest.raises(AssertionError):
        test_every_setting_has_an_option_and_a_row()
