"""What the two SQL dialects (``sqlite/``, ``postgres/``) are built on, written once.

``codec`` (records ↔ table rows, in one column order for both), ``queries`` (the
loader of a dialect's named queries, ``queries.sql``) and ``migrate`` (the runner of
a dialect's numbered migrations, ``migrations/``).  A dialect supplies only what its
database makes different: how it stores an integer and a flag, its SQL text, how it
takes the migration lock.
"""
