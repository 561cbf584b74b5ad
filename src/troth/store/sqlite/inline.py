"""The event loop's reader: point reads from one held read snapshot.

A point read on its own costs a read transaction: SQLite takes a read mark in the
WAL index (file locks on the ``-shm`` file, system calls) and lets it go again.
That was two thirds of the SQLite time of a ``promise.get`` (~4 of ~6 µs). So the
reader keeps its read transaction open from one point read to the next, for as long
as nothing has been committed since the snapshot began, and reads inside it.

*Nothing has been committed* is read where SQLite itself reads it: the WAL-index
header at the start of the ``-shm`` file (sqlite.org/walformat.html, "The
WAL-Index Header"), which every commit of every connection and process rewrites (its
change counter, frame count and salts). The reader keeps the header as it was just
before its snapshot began; while the header is unchanged the snapshot holds every
commit there is, so a read inside it answers exactly what a new one would. Once
the header differs, the snapshot ends and the next read begins a new one. The
header is mapped read-only and compared as 48 bytes: ~0.1 µs, not a system call.

A held snapshot must not starve checkpoints (a WAL restarts only when no reader
holds a mark in it, and a COMMIT's checkpoint copies no further than the oldest
mark), so it is let go:

* before this process begins a write batch on the event loop
  (``SqliteStore.begin_nowait``), and after each read while a write transaction of
  this process is open (a batch, or its COMMIT lent to the writer thread): the
  COMMIT and its checkpoint never find the loop's snapshot in their way, and under
  write load a snapshot lives from one COMMIT to the next batch;
* at the latest :data:`HOLD` seconds after it began (a timer), so another process's
  writer, or this one's on its own thread, waits for it at most that long;
* after every read when there is no running event loop to end it later.

Where the header cannot be mapped (no ``-shm`` file, a header this code does not
know) every read is its own read transaction, as before.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import sqlite3
import struct
from collections.abc import Callable
from typing import Final, Protocol, TypeVar

from troth.store.base import Backend, ReadOnly
from troth.store.faults import StoreUnavailable

T = TypeVar("T")

#: Seconds a snapshot is held at most.
HOLD: Final = 0.05
#: Bytes of the WAL-index header's first copy (what a commit rewrites).
HEADER: Final = 48
#: The header's ``iVersion``, the only one SQLite has written since WAL began.
_WAL_INDEX_VERSION: Final = 3007000


def map_header(db_path: str) -> mmap.mmap | None:
    """The WAL-index header of ``db_path``, mapped read-only; None if there is no
    ``-shm`` file, it is too short, or its header is not one this code knows.

    Only while a connection of this process has the database open: SQLite truncates
    a ``-shm`` file only when no process has it open."""
    try:
        fd = os.open(db_path + "-shm", os.O_RDONLY)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size < HEADER:
            return None
        header = mmap.mmap(fd, HEADER, mmap.MAP_SHARED, mmap.PROT_READ)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    version, _, _, initialised = struct.unpack_from("=IIIB", header)
    if version != _WAL_INDEX_VERSION or not initialised:
        header.close()
        return None
    return header


class Writer(Protocol):
    """What the reader asks of its store."""

    #: Whether this process has a write transaction open (a batch, or its COMMIT
    #: lent to the writer thread): a snapshot held across it would hold a mark that
    #: the COMMIT's checkpoint cannot pass, and the WAL would never restart.
    writing: bool


class InlineReader:
    """One reader connection on the event loop, with its held snapshot; ``backend``
    reads on ``conn`` (the store's ``SqliteBackend``)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        backend: Backend,
        header: mmap.mmap | None,
        store: Writer,
    ) -> None:
        self.conn = conn
        self.backend = backend
        self.header = header
        self.store = store
        #: The header when the held snapshot began; None while none is held.
        self.seen: bytes | None = None
        self.timer: asyncio.TimerHandle | None = None
        #: The loop the timer is on (a timer of a loop that has ended never fires).
        self.timer_loop: asyncio.AbstractEventLoop | None = None

    def read(self, fn: Callable[[ReadOnly], T]) -> T:
        """``fn`` over the held snapshot (begun first if none is, or if something was
        committed since it began): what it returns or raises, except that where the
        reader could not read it raises :class:`StoreUnavailable` (the caller hands the
        read to the writer)."""
        header = self.header
        if self.seen is not None and (header is None or header[:HEADER] != self.seen):
            self.release()
        try:
            if self.seen is None:
                self.seen = b"" if header is None else header[:HEADER]
                self.conn.execute("BEGIN")
                self._hold()
            value = fn(ReadOnly(self.backend))
        except sqlite3.OperationalError as exc:
            self.release()
            raise StoreUnavailable(f"sqlite reader busy: {exc}") from exc
        finally:
            if header is None or self.timer is None or self.store.writing:
                # Nothing tells when to end it, nothing would end it later, or a write
                # transaction of this process is open: end it now.
                self.release()
        return value

    def _hold(self) -> None:
        """End the snapshot at the latest :data:`HOLD` seconds from now: a timer on the
        running loop, unless one is set there already; none without a running loop
        (or a header to read), and then every read ends its snapshot."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if self.timer is not None:
            if self.timer_loop is loop:
                return
            if self.timer_loop is not None and not self.timer_loop.is_closed():
                self.timer.cancel()
            self.timer = self.timer_loop = None  # its loop has ended: it never fires
        if loop is None or self.header is None:
            return
        self.timer = loop.call_later(HOLD, self._expired)
        self.timer_loop = loop

    def _expired(self) -> None:
        self.timer = self.timer_loop = None
        self.release()

    def release(self) -> None:
        """End the held snapshot, if one is held."""
        if self.seen is None:
            return
        self.seen = None
        try:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # a broken connection holds nothing either

    def close(self) -> None:
        if self.timer is not None:
            if self.timer_loop is not None and not self.timer_loop.is_closed():
                self.timer.cancel()
            self.timer = self.timer_loop = None
        self.release()
        if self.header is not None:
            self.header.close()  # before the connection: see map_header
            self.header = None
        self.conn.close()
