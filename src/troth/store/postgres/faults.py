"""Which PostgreSQL errors say the database refuses writes (``Store.refused``).

``53100 disk_full`` (a tablespace or the WAL's disk is full) and the rest of class
53, insufficient resources; ``25006 read_only_sql_transaction`` (a standby, a
database or server set ``default_transaction_read_only``, or a disk-space guard that
switches it on).  A batch that meets one is refused whole: every job of it would
meet it too (``PostgresStore.execute``).
"""

from __future__ import annotations

from typing import Final

import psycopg

from troth.store.faults import StoreFault

DISK_FULL: Final = "53100"
READ_ONLY: Final = "25006"
#: Insufficient resources: out of memory, too many connections, …
RESOURCES: Final = "53"


def write_refused(exc: BaseException) -> StoreFault | None:
    """The fault ``exc`` is, or caused (``__cause__``, as the store's internal re-run
    signals carry the database's error), if any."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 4:
        if isinstance(cause, StoreFault):
            return cause
        if isinstance(cause, psycopg.Error):
            state = cause.sqlstate or ""
            if state == DISK_FULL:
                return StoreFault("disk_full", str(cause))
            if state == READ_ONLY:
                return StoreFault("read_only", str(cause))
            if state.startswith(RESOURCES):
                return StoreFault("unavailable", str(cause))
            return None
        cause = cause.__cause__
        seen += 1
    return None
