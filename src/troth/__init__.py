"""troth: a durable promise server for the Resonate protocol (2026-04-01)."""

__version__ = "0.1.0"
PROTOCOL_VERSION = "2026-04-01"
