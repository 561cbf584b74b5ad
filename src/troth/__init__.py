"""troth: a durable promise server for the Resonate protocol (2026-04-01)."""

#: The release, set here and only here (pyproject.toml reads it; CHANGELOG.md says
#: what each one changed).  troth.version adds the schema version beside it.
__version__ = "0.2.0"
PROTOCOL_VERSION = "2026-04-01"
