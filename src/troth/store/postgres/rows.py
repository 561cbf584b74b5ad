"""The PostgreSQL store's named statements and row codec, and how rows become the
parameters of its multi-row statements.

Every write of a batch goes out as few statements as possible: rows of one kind
become parallel column arrays (one ``text[]`` per column, numbers as exact text),
and one statement takes them all.  Values PostgreSQL text cannot hold are refused
here, before anything is sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from troth.protocol.records import Execute, OutboxEntry
from troth.store.postgres.session import NUL, TextArray, Unstorable
from troth.store.sql.codec import RowCodec
from troth.store.sql.queries import load_queries
from troth.store.writes import Writes

Q: Final = load_queries("troth.store.postgres")
CODEC: Final = RowCodec()


def refuse_nul(writes: Writes) -> None:
    """Raise before anything is sent if a value PostgreSQL text cannot hold is written.

    Only text the server stores or parses as such counts: ids, states, tag keys and
    values (searched through ``jsonb``), addresses, keys.  Other JSON columns are
    msgspec text, where U+0000 is escaped.
    """
    # Group by group (no list of them all built first): it runs for every job's writes.
    for p in writes.promises.values():
        _refuse_nul((p.id, p.state))
        _refuse_nul(p.tags)
        _refuse_nul(p.tags.values())
    for t in writes.tasks.values():
        _refuse_nul((t.id, t.state, t.pid or ""))
    for id, s in writes.schedules.items():
        _refuse_nul((id,))
        if s is not None:
            _refuse_nul((s.cron, s.promise_id))
            _refuse_nul(s.promise_tags)
            _refuse_nul(s.promise_tags.values())
    for key, entry in writes.messages.items():
        _refuse_nul((key, entry.address))
        if isinstance(entry.message, Execute):
            _refuse_nul((entry.message.task_id,))


def _refuse_nul(texts: Iterable[str]) -> None:
    """:func:`~troth.store.postgres.session.has_nul` that names the offending text."""
    for text in texts:
        if NUL in text:
            raise Unstorable(f"PostgreSQL text cannot hold U+0000: refusing to store {text!r}")


# The boolean columns of a promise and a task row (codec order): every other column
# goes as ``text[]`` (numbers as exact text, cast to NUMERIC by the statement).
FLAGS_P: Final = frozenset({10, 12})
FLAGS_T: Final = frozenset[int]()


def columns(rows: Sequence[tuple[Any, ...]], flags: frozenset[int] = FLAGS_T) -> list[list[Any]]:
    """Rows to parallel column arrays: ``text[]`` (:class:`TextArray`) but for the
    boolean columns ``flags`` (none: every column text, as the outbox's)."""
    return [list(c) if i in flags else TextArray(c) for i, c in enumerate(zip(*rows, strict=True))]


def message_row(
    key: str, entry: OutboxEntry, now: int, available_at: int | None
) -> tuple[Any, ...]:
    """The codec's message row plus its parsed ``poll://`` destination (claims route
    on it: ``claim_routed``)."""
    return CODEC.message_row(key, entry, now, available_at) + CODEC.destination(entry.address)


def traces_statement(traces: dict[str, str]) -> tuple[str, list[list[Any]]]:
    """One ``set_traces`` for ``Writes.traces`` (ids sorted: the rows' lock order)."""
    ids = sorted(traces)
    return Q["set_traces"], [TextArray(ids), TextArray([traces[id] for id in ids])]


def messages_statement(rows: Sequence[tuple[Any, ...]]) -> tuple[str, list[list[Any]]]:
    """One ``upsert_messages`` for message rows in emission order (all text arrays)."""
    return Q["upsert_messages"], columns(rows)
