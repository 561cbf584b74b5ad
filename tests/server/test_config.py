"""Configuration: one name per setting in flags, ``TROTH_*`` and ``troth.toml``."""

from __future__ import annotations

from pathlib import Path

import pytest

from troth.cli.main import add_server_flags, settings_from
from troth.server.config import ConfigError, Settings, load


def parse(argv: list[str]) -> Settings:
    import argparse

    p = argparse.ArgumentParser()
    add_server_flags(p)
    return settings_from(p.parse_args(argv))


def test_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = load(environ={})
    assert (s.port, s.store, s.db, s.synchronous, s.retry_timeout) == (
        8001,
        "sqlite",
        "troth.db",
        "full",
        5000,
    )
    assert s.max_body == 10 * 1024 * 1024
    assert s.debug is False


def test_toml_env_and_flags_use_the_same_names_and_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "troth.toml").write_text(
        'port = 9000\nretry_timeout = 7000\nstore = "memory"\nlog_level = "warning"\n'
        "max_body = 2048\ndebug = true\n"
    )
    s = load(environ={})
    assert (s.port, s.retry_timeout, s.store, s.log_level, s.max_body, s.debug) == (
        9000,
        7000,
        "memory",
        "warning",
        2048,
        True,
    )
    monkeypatch.setenv("TROTH_PORT", "9100")
    monkeypatch.setenv("TROTH_RETRY_TIMEOUT", "8000")
    monkeypatch.setenv("TROTH_DEBUG", "false")
    s = parse([])
    assert (s.port, s.retry_timeout, s.debug) == (9100, 8000, False)
    s = parse(["--port", "9200", "--retry-timeout", "9000", "--debug", "--db", "x.db"])
    assert (s.port, s.retry_timeout, s.debug, s.db) == (9200, 9000, True, "x.db")
    assert s.store == "memory"  # from the file, nothing overrode it


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"TROTH_RETRY_TIMEOUT": "0"}, "retry_timeout must be > 0"),
        ({"TROTH_PORT": "eighty"}, "invalid value for port"),
        ({"TROTH_STORE": "oracle"}, "store must be"),
        ({"TROTH_SYNCHRONOUS": "off"}, "synchronous must be"),
        ({"TROTH_MAX_BODY": "-1"}, "max_body must be > 0"),
        ({"TROTH_DEBUG": "maybe"}, "invalid value for debug"),
    ],
)
def test_bad_values_are_refused_with_a_message(
    environ: dict[str, str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        load(environ=environ)


def test_unknown_toml_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'prot'"):
        load(environ={}, toml_path=str(path))


def test_missing_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load(environ={}, toml_path=str(tmp_path / "nope.toml"))
