"""The engine: runs requests in store transactions and drives the timer.

Every request waiting is run in one transaction (group commit: one fsync for the
batch, each request isolated in its own overlay), committed once, and answered.  One
writer thread owns the store's connection.  For a store with ``loop_batches`` (SQLite)
the event loop runs the batch itself and lends the connection to the writer thread
only for the COMMIT — the one step that waits (the fsync) — and for exclusive work
(snapshots, the outbox lifecycle, retention); the loop never waits for the disk.
Other stores' batches (PostgreSQL: round trips) run whole on the writer thread.

The timer sleeps until the store's earliest deadline.  A commit that armed an
earlier deadline wakes it at once; there is no polling tick.  Its unit of work is
``machine.core.tick`` (ARCHITECTURE rule 4): the engine loops it, and stops it on
shutdown.

One module per concern: ``core`` (the :class:`Engine`, its start and stop),
``base`` (its state, and what its parts call in one another), ``work`` (what is
queued and how an outcome is answered), ``requests`` (the request API),
``batches`` (batches on the event loop), ``writer`` (the writer and reader
threads), ``commits`` (what follows a batch), ``watchdog`` (no job waits past its
deadline), ``probing`` and ``health`` (whether the store takes writes), ``timer``
and ``clock`` (deadlines, and the wall clock's steps), ``limits`` (flow control).
It imports nothing of ``troth.server``: the server wires it to HTTP, delivery and
the cluster.
"""

from troth.engine.base import DEADLINE, Commit, EngineStats
from troth.engine.core import Engine
from troth.engine.work import MAX_BATCH, Traced

__all__ = ["DEADLINE", "MAX_BATCH", "Commit", "Engine", "EngineStats", "Traced"]
