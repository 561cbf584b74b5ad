"""The rule of rolling upgrades, checked on the SQL itself (docs/operations.md,
"Upgrades"): migrations from version 6 on only expand the schema, and no query reads
or writes columns by position, so a column a newer release adds is invisible to an
older one.  A migration that must contract is made in a later release than the one
that stopped using what it removes; list it in ``CONTRACTIONS`` with that reason."""

from __future__ import annotations

import re

import pytest

from troth.store.sql.migrate import Migration, load_migrations

#: The first version written under the rule (earlier ones predate rolling upgrades).
RULE_SINCE = 6
DIALECTS = ["troth.store.sqlite", "troth.store.postgres"]
#: (package, version) → why a contraction is safe (no release still running reads it).
CONTRACTIONS: dict[tuple[str, int], str] = {}

_COMMENT = re.compile(r"--[^\n]*")
_FORBIDDEN = {
    "drops": re.compile(r"\bDROP\s+(TABLE|COLUMN|VIEW|INDEX|TRIGGER|FUNCTION)\b", re.I),
    "renames": re.compile(r"\bRENAME\b", re.I),
    "changes a column's type": re.compile(r"\bALTER\s+COLUMN\s+\w+\s+(SET\s+DATA\s+)?TYPE\b", re.I),
    "makes a column NOT NULL": re.compile(r"\bSET\s+NOT\s+NULL\b", re.I),
    "adds a NOT NULL column without a default": re.compile(
        r"\bADD\s+COLUMN\b(?:(?!\bDEFAULT\b)[^,;])*\bNOT\s+NULL\b(?:(?!\bDEFAULT\b)[^,;])*[,;]",
        re.I,
    ),
}


def violations(sql: str) -> list[str]:
    text = _COMMENT.sub("", sql)
    return [what for what, pattern in _FORBIDDEN.items() if pattern.search(text)]


def under_the_rule() -> list[tuple[str, Migration]]:
    return [
        (package, m)
        for package in DIALECTS
        for m in load_migrations(package)
        if m.version >= RULE_SINCE
    ]


@pytest.mark.parametrize(
    ("package", "migration"),
    under_the_rule(),
    ids=[f"{p.rsplit('.', 1)[1]}-{m.version:03d}" for p, m in under_the_rule()],
)
def test_migrations_only_expand(package: str, migration: Migration) -> None:
    found = violations(migration.sql)
    if (package, migration.version) in CONTRACTIONS:
        return
    assert not found, f"{package} {migration.version:03d}_{migration.name}: {found}"


def test_the_check_knows_a_contraction_when_it_sees_one() -> None:
    assert violations("ALTER TABLE nodes DROP COLUMN url;") == ["drops"]
    assert violations("ALTER TABLE t RENAME COLUMN a TO b;") == ["renames"]
    assert violations("ALTER TABLE t ALTER COLUMN a TYPE BIGINT;") == ["changes a column's type"]
    assert violations("ALTER TABLE t ALTER COLUMN a SET NOT NULL;") == ["makes a column NOT NULL"]
    assert violations("ALTER TABLE t ADD COLUMN a TEXT NOT NULL;") == [
        "adds a NOT NULL column without a default"
    ]
    assert violations("ALTER TABLE t ADD COLUMN a TEXT NOT NULL DEFAULT '';") == []
    assert violations("ALTER TABLE t ADD COLUMN a TEXT, ADD COLUMN b INT;") == []
    assert violations("-- DROP TABLE x\nCREATE INDEX i ON t (a);") == []


@pytest.mark.parametrize("package", DIALECTS)
def test_queries_name_their_columns(package: str) -> None:
    """``SELECT *`` of a table or ``RETURNING *`` would hand an older release the
    columns a newer one added, shifting every position it decodes."""
    from importlib import resources

    text = _COMMENT.sub("", resources.files(package).joinpath("queries.sql").read_text())
    star = re.findall(r"\bSELECT\s+\*\s+FROM\s+(?!unnest\b)\w+|\bRETURNING\s+\*", text, re.I)
    assert not star, star
    positional = re.findall(r"\bINSERT\s+INTO\s+\w+\s+(?:VALUES|SELECT)\b", text, re.I)
    assert not positional, positional
