"""A consistent copy of a live SQLite database (``troth backup``), verified.

Why SQLite's online backup API (``sqlite3.Connection.backup``) and not ``VACUUM
INTO``: both read one snapshot from a connection of their own, and in WAL mode
neither blocks the server's writer.  The backup API copies pages as they are, so
it costs a sequential read and write of the file; ``VACUUM INTO`` rebuilds every
table and index row by row (slower, more CPU, a compacted copy).  The backup runs
in **one step** (``pages=-1``): a stepwise backup restarts from the beginning
whenever another connection writes the source, so under steady load it might
never finish, while one step is a single read transaction that writes cannot
disturb.  The price of that transaction is that the server's checkpoints cannot
recycle the WAL while it lasts: the ``-wal`` file grows by what is written during
the backup and is reused afterwards.

Why not ``cp``: a live database is the main file *plus* the WAL, which holds
committed transactions not yet checkpointed into the file; a copy of the main
file alone lacks them, and copying the two while a checkpoint moves pages between
them can give a torn, corrupt pair.

The copy is written beside ``path`` under a temporary name, converted to a
rollback journal (one self-contained file, no ``-wal``/``-shm`` to carry along;
troth turns WAL back on when it opens it), checked (``integrity_check``, schema
version, row counts equal to the source's in the same snapshot), fsynced, and only
then moved to ``path``: an interrupted or failed backup never leaves a half copy
where a good one is expected.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from troth.store.sql.migrate import SchemaError, check_version
from troth.store.sqlite.migrate import SqliteSchema

TABLES: Final = ("promises", "tasks", "schedules", "outbox")


class BackupError(RuntimeError):
    """The backup was refused or failed; nothing was left at the destination."""


@dataclass(frozen=True)
class BackupReport:
    """What was copied, and how it was found when the copy was opened."""

    path: str
    schema_version: int
    counts: dict[str, int]
    size: int
    seconds: float


def connect_existing(
    path: str | os.PathLike[str], *, read_only: bool = False
) -> sqlite3.Connection:
    """A connection to a database file that must already exist (plain ``connect``
    would create an empty one, and a typo would back up or migrate nothing).

    ``read_only`` opens the file with ``mode=ro``; for a live source use the default
    (``mode=rw``, only read through ``query_only``): a read-only connection cannot
    create the WAL index a WAL database needs when no other connection has it open.
    """
    file = Path(path)
    if not file.is_file():
        raise BackupError(f"no database file at {path}")
    uri = f"{file.absolute().as_uri()}?mode={'ro' if read_only else 'rw'}"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("PRAGMA query_only = 1")
    except sqlite3.Error as exc:
        raise BackupError(f"cannot open {path}: {exc}") from exc
    return conn


def troth_version(conn: sqlite3.Connection, path: str | os.PathLike[str]) -> int:
    """The schema version of a troth database; refuses a file that is not one (or one
    written by a newer troth)."""
    try:
        version = check_version(SqliteSchema(conn))
    except SchemaError as exc:
        raise BackupError(f"{path}: {exc}") from exc
    except sqlite3.DatabaseError as exc:
        raise BackupError(f"{path} is not a SQLite database: {exc}") from exc
    if version == 0:
        raise BackupError(f"{path} is not a troth database (it has no schema_version)")
    return version


def row_counts(conn: sqlite3.Connection) -> dict[str, int]:
    return {t: int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in TABLES}


def backup(
    db: str | os.PathLike[str], path: str | os.PathLike[str], *, force: bool = False
) -> BackupReport:
    """Copy the troth database ``db`` to ``path`` while a server may be writing it.

    Refuses an existing ``path`` unless ``force`` (then it is replaced only once the
    new copy is verified).  Raises :class:`BackupError` with the reason.
    """
    started = time.monotonic()
    dest = Path(path)
    if dest.is_dir():
        raise BackupError(f"{path} is a directory; give the path of the copy's file")
    if dest.exists() and not force:
        raise BackupError(f"{path} exists; pass --force to replace it")
    if dest.exists() and Path(db).exists() and os.path.samefile(db, dest):
        raise BackupError(f"{path} is the database itself")
    if not dest.parent.is_dir():
        raise BackupError(f"directory {dest.parent} does not exist")
    partial = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    source = connect_existing(db)
    try:
        version = troth_version(source, db)
        source.execute("BEGIN")
        try:
            # The snapshot starts at this first read; the backup below reads the same one
            # (it runs inside this read transaction), so these counts are the copy's.
            counts = row_counts(source)
            _remove(partial)
            target = sqlite3.connect(partial, isolation_level=None)
            try:
                source.backup(target)  # pages=-1: one step, one snapshot (module docstring)
                target.execute("PRAGMA journal_mode = DELETE").fetchone()
            finally:
                target.close()
        finally:
            source.execute("ROLLBACK")
    except sqlite3.Error as exc:
        _remove(partial)
        raise BackupError(f"backup of {db} failed: {exc}") from exc
    except BaseException:
        _remove(partial)
        raise
    finally:
        source.close()
    try:
        found = verify(partial, version, counts)
        _fsync(partial)
        _place(partial, dest, force)
    except BaseException:
        _remove(partial)
        raise
    return BackupReport(str(dest), found, counts, dest.stat().st_size, time.monotonic() - started)


def verify(path: str | os.PathLike[str], version: int, counts: dict[str, int]) -> int:
    """Open the copy read-only and check it: ``integrity_check`` (every page, index
    and constraint), its schema version, and its row counts against ``counts``."""
    conn = connect_existing(path, read_only=True)
    try:
        problems = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
        if problems != ["ok"]:
            raise BackupError(f"the copy fails integrity_check: {'; '.join(problems[:5])}")
        found = troth_version(conn, path)
        if found != version:
            raise BackupError(f"the copy has schema version {found}, the source {version}")
        copied = row_counts(conn)
        if copied != counts:
            raise BackupError(f"the copy holds {copied} rows, the source held {counts}")
        return found
    except sqlite3.Error as exc:
        raise BackupError(f"the copy cannot be read: {exc}") from exc
    finally:
        conn.close()


def _place(partial: Path, dest: Path, force: bool) -> None:
    """Move the verified copy to ``dest``: without ``force`` a hard link, which fails
    if ``dest`` appeared meanwhile (never overwriting what someone else put there)."""
    if force:
        os.replace(partial, dest)
    else:
        try:
            os.link(partial, dest)
        except FileExistsError:
            raise BackupError(f"{dest} exists; pass --force to replace it") from None
        except OSError:  # a file system without hard links
            if dest.exists():
                raise BackupError(f"{dest} exists; pass --force to replace it") from None
            os.replace(partial, dest)
        _remove(partial)
    _fsync_dir(dest.parent)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    """Make the rename durable (POSIX); a platform that cannot open a directory skips it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    """The partial copy and whatever companion files SQLite made for it."""
    for suffix in ("", "-journal", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            path.with_name(path.name + suffix).unlink()
