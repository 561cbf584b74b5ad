"""What this build of troth is: its release, the schema it builds, the protocol it speaks.

The release is ``troth.__version__``, the one place it is set (``pyproject.toml``
reads it from there when the package is built).  The schema version is not written
anywhere: it is the highest numbered migration this build ships
(``store/<dialect>/migrations/NNN_*.sql``), so it cannot drift from the schema the
code actually builds.  Both SQL stores are kept at the same number; should they ever
differ, the higher one is reported.

``troth --version``, ``GET /health``, the dashboard's footer and the startup line all
read these three values from here, so two builds are told apart the same way
everywhere.
"""

from __future__ import annotations

import functools

from troth import PROTOCOL_VERSION, __version__
from troth.store.sql.migrate import load_migrations

#: The packages whose ``migrations/`` folder holds a SQL store's schema.
SCHEMA_PACKAGES = ("troth.store.sqlite", "troth.store.postgres")


@functools.cache
def schema_version() -> int:
    """The schema version a database opened by this build ends up at."""
    return max(len(load_migrations(package)) for package in SCHEMA_PACKAGES)


def describe() -> str:
    """One line for people: ``troth 0.2.0 (schema 7, protocol 2026-04-01)``."""
    return f"troth {__version__} (schema {schema_version()}, protocol {PROTOCOL_VERSION})"


@functools.cache
def health() -> dict[str, object]:
    """The body of ``GET /health``: the process answers, and which build it is.

    Built once: a load balancer's health probe costs one cached dict."""
    return {
        "status": "ok",
        "version": __version__,
        "schema": schema_version(),
        "protocol": PROTOCOL_VERSION,
    }
