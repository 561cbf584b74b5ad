"""``troth migrate check|plan|apply``: the schema step on its own, for operators who
migrate separately from starting servers (docs/operations.md, "Upgrades").

* ``check``: where the schema stands; exit 0 up to date, 1 migrations are due.
* ``plan``: the migrations ``apply`` would run (number, name, SQL file; ``--sql``
  prints their text) and the nodes alive now.
* ``apply``: run them now, even under live nodes of the previous release (the
  expand-only rule makes that safe; ``serve`` alone would refuse).

The store is the one ``serve`` would use (``--config``/``--store``/``--db``/
``--postgres-url``).  Exit codes: 0 done (or up to date), 1 migrations due
(``check``), 2 bad usage or configuration, 4 a schema this troth may not touch
(newer, or unknown), as ``serve`` refuses it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from troth.cli.help import Formatter
from troth.server.config import ConfigError, load
from troth.store.upgrade import EXIT_SCHEMA

MIGRATE_EPILOG = """\
exit status: 0 done or up to date, 1 migrations due (check), 2 bad usage,
4 a newer or unknown schema.

examples:
  troth migrate check --db troth.db
  troth migrate plan --postgres-url postgresql://troth@db/troth --sql
  troth migrate apply --postgres-url postgresql://troth@db/troth"""


def add_migrate_command(sub: Any) -> None:
    """Register ``migrate`` on the CLI's subparsers."""
    p = sub.add_parser(
        "migrate",
        help="check, plan or apply schema migrations as a step of their own",
        description="Check the database's schema against this troth, show the migrations "
        "it would run, or run them (see docs/operations.md, Upgrades).",
        epilog=MIGRATE_EPILOG,
        formatter_class=Formatter,
    )
    p.add_argument(
        "action",
        choices=["check", "plan", "apply"],
        help="check: exit 1 if migrations are due; plan: list them; apply: run them",
    )
    p.add_argument("--config", help="path of a troth.toml (default: ./troth.toml if present)")
    p.add_argument("--store", choices=["sqlite", "postgres"], help="storage backend")
    p.add_argument("--db", help="SQLite database file (default troth.db)")
    p.add_argument("--postgres-url", help="PostgreSQL connection URI (with --store postgres)")
    p.add_argument("--sql", action="store_true", help="with plan: print each migration's SQL")


def run_migrate(args: argparse.Namespace) -> int:
    from troth.store.sql.migrate import SchemaError, load_migrations
    from troth.store.upgrade import apply_sqlite, open_schema, sql_file, status

    try:
        settings = load(
            {
                # --postgres-url alone means PostgreSQL (the setting's default is SQLite).
                "store": args.store or ("postgres" if args.postgres_url else None),
                "db": args.db,
                "postgres_url": args.postgres_url,
            },
            toml_path=args.config,
        )
    except ConfigError as exc:
        print(f"troth migrate: {exc}", file=sys.stderr)
        return 2
    if settings.store == "memory":
        print("troth migrate: a memory store has no schema to migrate", file=sys.stderr)
        return 2
    where = settings.db if settings.store == "sqlite" else "PostgreSQL"
    within = round(settings.node_timeout * 1000)
    try:
        with open_schema(settings.store, db=settings.db, postgres_url=settings.postgres_url) as s:
            st = status(s, within)
            files = {m.version: sql_file(s, m) for m in load_migrations(s.package)}
    except SchemaError as exc:
        print(f"troth migrate: {exc}", file=sys.stderr)
        return EXIT_SCHEMA
    live = ", ".join(
        f"{n['node']} (release {n['release'] or 'older'}, schema {n['schema'] or '-'})"
        for n in st.live
    )
    if args.action == "check":
        if not st.pending:
            print(f"{where}: schema version {st.stored}, up to date")
            return 0
        names = ", ".join(f"{m.version:03d}_{m.name}" for m in st.pending)
        print(f"{where}: schema version {st.stored} of {st.latest}; due: {names}")
        return 1
    if args.action == "plan":
        if not st.pending:
            print(f"{where}: schema version {st.stored}, up to date; nothing to run")
        else:
            print(f"{where}: schema version {st.stored} -> {st.latest}; apply would run:")
            for m in st.pending:
                print(f"  {m.version:03d} {m.name:<24} {files[m.version]}")
                if args.sql:
                    print("\n".join(f"      {line}" for line in m.sql.strip().splitlines()))
        if live:
            print(f"nodes alive now: {live}")
        return 0
    if not st.pending:
        print(f"{where}: schema version {st.stored}, up to date; nothing to run")
        return 0
    if live:
        print(f"migrating under live nodes: {live}", file=sys.stderr)
    try:
        if settings.store == "sqlite":
            reached = apply_sqlite(settings.db)
        else:
            from troth.store.sql.migrate import migrate

            with open_schema("postgres", db="", postgres_url=settings.postgres_url) as s:
                reached = migrate(s)
    except SchemaError as exc:
        print(f"troth migrate: {exc}", file=sys.stderr)
        return EXIT_SCHEMA
    for m in st.pending:
        print(f"applied {m.version:03d}_{m.name}")
    print(f"{where}: schema version {reached}")
    return 0
