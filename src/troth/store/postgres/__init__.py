"""The PostgreSQL store: several troth nodes on one database.

``session`` (a connection that reconnects and re-runs), ``backend`` (one
transaction's locked reads and coalesced writes) with its ``scans`` and its
``flow`` control tables, ``rows`` (the named statements, the codec, rows as column
arrays), ``claims`` (a batch's messages inserted already claimed), ``store`` (group
commit, re-run whole on conflicts), ``outbox`` (the lifecycle's own connection,
routed claims, NOTIFY), ``migrate``; the SQL is in ``queries.sql`` and
``migrations/``.
"""

from troth.store.postgres.backend import PostgresBackend
from troth.store.postgres.outbox import CHANNEL, PostgresOutbox, Routing
from troth.store.postgres.session import StoreBusy, Unstorable
from troth.store.postgres.store import PostgresStore

__all__ = [
    "CHANNEL",
    "PostgresBackend",
    "PostgresOutbox",
    "PostgresStore",
    "Routing",
    "StoreBusy",
    "Unstorable",
]
