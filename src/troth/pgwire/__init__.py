"""troth's PostgreSQL wire: statements sent with libpq's own pipeline calls, under
psycopg's cursor layer.

Why: psycopg's cursor and pipeline machinery cost the writer thread far more than
the statements themselves.  A prefetch-like pipeline (``BEGIN``, two ``SET LOCAL``,
a locked read of 20 ids, two ``SET LOCAL``, ``COMMIT``) takes ~255 µs of the
calling thread's CPU through cursors in a ``conn.pipeline()`` block, and ~52 µs
sent here (docs/performance-notes.md, "Statements under psycopg's cursor layer").  A
node is bound by the CPU of its one process (event loop and writer under one
GIL), so what the writer saves, the node can spend on requests.

What it keeps from psycopg: the connection (connect, reconnect, ``commit``,
``rollback``, transaction status — all read live from libpq), its error classes
(a failed statement raises what psycopg would: ``sqlstate`` and all), and its
compiled row loaders (numeric columns as ``int``, :data:`session.IntLoader`).

What it does itself:

- Each statement with parameters is prepared on its second use on a connection,
  under a name of its own, and then executed by name; psycopg's own preparing is switched off on the
  connection (``prepare_threshold = None``), since psycopg answers a ``ROLLBACK``
  on a connection where it prepared statements with ``DEALLOCATE ALL``, which would
  drop these too.  A name counts as prepared only once its Parse succeeded.
- Parameters are sent as psycopg's placeholders (``%s``, ``%b``, ``%(name)s``)
  say, converted once per statement text to ``$n``.  Values: ``str``, ``int``,
  ``bool``, None, ``bytes`` and lists of ``str`` / None (``text[]``, binary) or of
  ``bool`` (``bool[]``).  Anything else is :class:`Unencodable`: the caller sends
  that statement through psycopg instead.
- Statements of one call go in one pipeline with one sync (one round trip); the
  first error is raised after the sync, as a psycopg error.  When the connection
  is not in a transaction and not in autocommit, a ``BEGIN`` goes first, as
  psycopg's cursor would send it.
- Behind a pooler in transaction mode (``prepare=False``), one server connection
  serves many clients' transactions in turn: a name prepared on one is unknown on
  (or taken by another client on) the next.  Nothing is then prepared: every
  statement goes unnamed (Parse, Bind, Execute in the same pipeline), and the
  session's settings go as ``SET LOCAL`` after each ``BEGIN`` (:attr:`Wire.after_begin`).
"""

from troth.pgwire.cursor import WireCursor
from troth.pgwire.params import TEXT_ARRAY_OID, Unencodable, encode, text_array
from troth.pgwire.pipeline import BEGIN, MAX_PREPARED, PREPARE_AFTER, Wire

__all__ = [
    "BEGIN",
    "MAX_PREPARED",
    "PREPARE_AFTER",
    "TEXT_ARRAY_OID",
    "Unencodable",
    "Wire",
    "WireCursor",
    "encode",
    "text_array",
]
