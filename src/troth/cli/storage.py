"""``troth backup`` and ``troth migrate-store``: the operator's copies of a store.

``backup PATH`` copies a live SQLite database consistently and checks the copy
(``store/sqlite/backup.py`` says how and why); ``migrate-store --from sqlite:PATH
--to postgresql://…`` moves a stopped SQLite deployment into an empty PostgreSQL
database and compares the two (``store/transfer.py``).  Both print what they
checked; exit codes: 0 done and verified, 1 refused or failed (the reason on
stderr; nothing left half-written), 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from troth.cli.help import Formatter
from troth.server.config import ConfigError, load

_SQLITE_PREFIX = "sqlite:"

BACKUP_EPILOG = """\
examples:
  troth backup /backups/troth-2026-12-04.db
  troth backup copy.db --db /var/lib/troth/troth.db --force

exit codes: 0 copied and verified, 1 refused or failed, 2 bad usage."""

MIGRATE_EPILOG = """\
examples:
  troth migrate-store --from sqlite:troth.db --to postgresql://troth@db/troth

exit codes: 0 copied and verified, 1 refused or failed, 2 bad usage."""


def _is_conninfo(text: str) -> bool:
    """A PostgreSQL URI or a libpq ``key=value`` string (as ``--postgres-url`` takes)."""
    if text.startswith(("postgresql://", "postgres://")):
        return True
    import psycopg

    try:
        return bool(psycopg.conninfo.conninfo_to_dict(text)) and "=" in text
    except psycopg.Error:
        return False


def add_storage_commands(sub: Any) -> None:
    """Register ``backup`` and ``migrate-store`` on the CLI's subparsers."""
    backup = sub.add_parser(
        "backup",
        help="copy a live SQLite database, verified",
        description="Copy the SQLite database (a consistent snapshot, while a server may "
        "be serving it), then open the copy and check it: integrity, schema version, "
        "row counts. Restore by stopping troth and putting the copy in place of the file.",
        epilog=BACKUP_EPILOG,
        formatter_class=Formatter,
    )
    backup.add_argument("path", metavar="PATH", help="file to write the copy to")
    backup.add_argument("--db", help="the SQLite database (default: the db setting, troth.db)")
    backup.add_argument("--config", help="path of a troth.toml (default: ./troth.toml if present)")
    backup.add_argument("--force", action="store_true", help="replace PATH if it exists")
    move = sub.add_parser(
        "migrate-store",
        help="move a SQLite deployment to PostgreSQL, verified",
        description="Copy every row of a troth SQLite database (stop the server first) "
        "into an empty PostgreSQL database, in one transaction, then compare both row by row.",
        epilog=MIGRATE_EPILOG,
        formatter_class=Formatter,
    )
    move.add_argument(
        "--from", dest="source", required=True, metavar="sqlite:PATH", help="the SQLite file"
    )
    move.add_argument(
        "--to",
        dest="target",
        required=True,
        metavar="postgresql://…",
        help="the empty target (URI or libpq string)",
    )
    move.add_argument("--batch", type=int, default=5000, help="rows per statement (5000)")


def run_storage(args: argparse.Namespace) -> int:
    if args.command == "backup":
        return _backup(args)
    return _migrate_store(args)


def _fail(message: str, code: int = 1) -> int:
    print(f"troth {message}", file=sys.stderr)
    return code


def _backup(args: argparse.Namespace) -> int:
    from troth.store.sqlite.backup import BackupError, backup

    try:
        db = args.db or load({}, toml_path=args.config).db
    except ConfigError as exc:
        return _fail(f"backup: {exc}", 2)
    try:
        report = backup(db, args.path, force=args.force)
    except BackupError as exc:
        return _fail(f"backup: {exc}")
    print(
        f"backup of {db} written to {report.path}: {report.size:,} bytes in "
        f"{report.seconds:.2f} s; integrity ok, schema version {report.schema_version}"
    )
    for table, n in report.counts.items():
        print(f"  {table:<10} {n:>12,}")
    return 0


def _migrate_store(args: argparse.Namespace) -> int:
    source: str = args.source
    if not source.startswith(_SQLITE_PREFIX) or len(source) == len(_SQLITE_PREFIX):
        return _fail("migrate-store: --from must be sqlite:PATH (e.g. sqlite:troth.db)", 2)
    target: str = args.target
    if not _is_conninfo(target):
        return _fail("migrate-store: --to must be a postgresql:// URL (or a libpq string)", 2)
    if args.batch < 1:
        return _fail("migrate-store: --batch must be at least 1", 2)
    from troth.store.transfer import TransferError, sqlite_to_postgres

    path = source[len(_SQLITE_PREFIX) :]
    try:
        report = sqlite_to_postgres(
            path, target, batch=args.batch, say=lambda line: print(line, file=sys.stderr)
        )
    except TransferError as exc:
        return _fail(f"migrate-store: {exc}")
    print(
        f"moved {path} to PostgreSQL: copied in {report.copy_seconds:.2f} s, compared row by "
        f"row in {report.verify_seconds:.2f} s, equal; next outbox id {report.next_outbox_id}"
    )
    for table, n in report.counts.items():
        print(f"  {table:<10} {n:>12,}")
    return 0
