"""Records ↔ table rows, written once for every SQL dialect.

Every SQL store keeps one row per object, in the same columns: the protocol
Structs' JSON fields as msgspec JSON *text* (SQLite's JSON functions refuse BLOBs,
and PostgreSQL casts the same text to ``jsonb`` where it searches), and the columns
that exist only to be searched (``external``, ``branch``, ``undrained``; an outbox
row's parsed ``poll://`` destination) derived from the object on every write.
What differs between dialects is how an integer and a flag are stored; a dialect
passes those two conversions and gets the whole codec.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import msgspec

from troth.outbox.rows import OutboxRow
from troth.protocol.address import parse_poll
from troth.protocol.records import (
    EMPTY_VALUE,
    PENDING,
    TAG_BRANCH,
    TAG_ORIGIN,
    Execute,
    OutboxEntry,
    Promise,
    PromiseRecord,
    Schedule,
    Task,
    Unblock,
    Value,
)
from troth.store.snapshot import snapshot

_encode = msgspec.json.Encoder().encode
_decode_value = msgspec.json.Decoder(Value).decode
_decode_tags = msgspec.json.Decoder(dict[str, str]).decode
_decode_strs = msgspec.json.Decoder(tuple[str, ...]).decode
_decode_record = msgspec.json.Decoder(PromiseRecord).decode

#: Column lists, in the order every row tuple below uses.
PROMISE_COLS: Final = (
    "id, state, param, value, tags, timeout_at, created_at, settled_at, callbacks, listeners"
)
TASK_COLS: Final = "id, state, version, ttl, pid, expires_at, retry_at, resumes"
SCHEDULE_COLS: Final = (
    "id, cron, promise_id, promise_timeout, promise_param, promise_tags, created_at, "
    "next_run_at, last_run_at"
)
OUTBOX_COLUMNS: Final = (
    "id",
    "address",
    "kind",
    "task_id",
    "version",
    "promise",
    "created_at",
    "state",
    "attempts",
    "available_at",
    "claim_token",
    "claimed_by",
    "claimed_at",
    "last_code",
    "updated_at",
)
OUTBOX_COLS: Final = ", ".join(OUTBOX_COLUMNS)

#: Every row of a table in id order (``debug.snap``), the same SQL on every dialect.
SELECT_ALL: Final = {
    table: f"SELECT {columns} FROM {table} ORDER BY id"
    for table, columns in (
        ("promises", PROMISE_COLS),
        ("tasks", TASK_COLS),
        ("schedules", SCHEDULE_COLS),
        ("outbox", OUTBOX_COLS),
    )
}


def json_text(obj: Any) -> str:
    """msgspec JSON as text: the same bytes on every dialect, so reads decode alike."""
    return _encode(obj).decode()


def _undrained(p: Promise) -> bool:
    """A settled promise whose callbacks or listeners are still to be drained."""
    return p.state != PENDING and bool(p.callbacks or p.listeners)


def _same(v: Any) -> Any:
    return v


class RowCodec:
    """Records to column tuples and back, given how a dialect stores ints and flags.

    ``int_in`` / ``int_out`` convert an integer (or None) to and from its stored
    form; ``flag`` converts a bool.  The written promise row carries four more
    columns than it reads back (``external, branch, undrained, origin``); a message row is
    ``(key, address, kind, task_id, version, promise, now)``, to which a dialect that
    routes claims by destination adds :meth:`destination`.
    """

    def __init__(
        self,
        int_in: Callable[[int | None], Any] = _same,
        int_out: Callable[[Any], Any] = _same,
        flag: Callable[[bool], Any] = _same,
    ) -> None:
        self.int_in = int_in
        self.int_out = int_out
        self.flag = flag

    def promise_row(self, p: Promise) -> tuple[Any, ...]:
        i = self.int_in
        return (
            p.id,
            p.state,
            json_text(p.param),
            json_text(p.value),
            json_text(p.tags),
            i(p.timeout_at),
            i(p.created_at),
            i(p.settled_at),
            json_text(p.callbacks),
            json_text(p.listeners),
            self.flag(p.external),
            p.tags.get(TAG_BRANCH) or None,
            self.flag(_undrained(p)),
            p.tags.get(TAG_ORIGIN),
        )

    def settle_row(self, p: Promise) -> tuple[Any, ...]:
        """What a settle changes of a stored promise row — ``state, value, settled_at,
        undrained`` — then its id (a dialect's ``settle_promise``)."""
        return (
            p.state,
            json_text(p.value),
            self.int_in(p.settled_at),
            self.flag(_undrained(p)),
            p.id,
        )

    def promise(self, r: Sequence[Any]) -> Promise:
        """A promise row's promise.  The commonest texts — the ``{}`` value of every
        pending promise, and no callbacks or listeners — are not decoded: they are
        the one empty value and the empty tuple (both immutable)."""
        o = self.int_out
        value, callbacks, listeners = r[3], r[8], r[9]
        return Promise(
            r[0],
            r[1],
            _decode_value(r[2]),
            EMPTY_VALUE if value == "{}" else _decode_value(value),
            _decode_tags(r[4]),
            o(r[5]),
            o(r[6]),
            o(r[7]),
            () if callbacks == "[]" else _decode_strs(callbacks),
            () if listeners == "[]" else _decode_strs(listeners),
        )

    def task_row(self, t: Task) -> tuple[Any, ...]:
        i = self.int_in
        return (
            t.id,
            t.state,
            i(t.version),
            i(t.ttl),
            t.pid,
            i(t.expires_at),
            i(t.retry_at),
            json_text(t.resumes),
        )

    def task(self, r: Sequence[Any]) -> Task:
        o = self.int_out
        return Task(r[0], r[1], o(r[2]), o(r[3]), r[4], o(r[5]), o(r[6]), _decode_strs(r[7]))

    def schedule_row(self, s: Schedule) -> tuple[Any, ...]:
        i = self.int_in
        return (
            s.id,
            s.cron,
            s.promise_id,
            i(s.promise_timeout),
            json_text(s.promise_param),
            json_text(s.promise_tags),
            i(s.created_at),
            i(s.next_run_at),
            i(s.last_run_at),
        )

    def schedule(self, r: Sequence[Any]) -> Schedule:
        o = self.int_out
        return Schedule(
            r[0],
            r[1],
            r[2],
            o(r[3]),
            _decode_value(r[4]),
            _decode_tags(r[5]),
            o(r[6]),
            o(r[7]),
            o(r[8]),
        )

    def message_row(
        self, key: str, entry: OutboxEntry, now: int, available_at: int | None = None
    ) -> tuple[Any, ...]:
        """The pending row's columns: created at ``now``, claimable from
        ``available_at`` (``now`` unless the server holds it back: ``Writes``)."""
        m = entry.message
        at = self.int_in(now)
        due = at if available_at is None else self.int_in(available_at)
        if isinstance(m, Execute):
            return (key, entry.address, "execute", m.task_id, self.int_in(m.version), None, at, due)
        return (key, entry.address, "unblock", None, None, json_text(m.promise), at, due)

    @staticmethod
    def destination(address: str) -> tuple[str | None, str | None, str | None]:
        """``(cast, group, id)`` of a ``poll://`` address; Nones for anything else."""
        poll = parse_poll(address)
        return (None, None, None) if poll is None else (poll.cast, poll.group, poll.id)

    def snapshot(self, execute: Callable[[str], Iterable[Sequence[Any]]]) -> dict[str, Any]:
        """``debug.snap`` of a database, read through ``execute`` (one transaction)."""
        return snapshot(
            [self.promise(r) for r in execute(SELECT_ALL["promises"])],
            [self.task(r) for r in execute(SELECT_ALL["tasks"])],
            [self.schedule(r) for r in execute(SELECT_ALL["schedules"])],
            [self.outbox_row(r) for r in execute(SELECT_ALL["outbox"])],
        )

    def outbox_columns(self, r: OutboxRow) -> tuple[Any, ...]:
        """A whole stored outbox row, lifecycle included (:data:`OUTBOX_COLUMNS` order):
        the inverse of :meth:`outbox_row`, for copying rows between stores
        (``store/transfer.py``), where a row keeps its id and delivery state."""
        i = self.int_in
        m = r.entry.message
        if isinstance(m, Execute):
            kind, task_id, version, promise = "execute", m.task_id, i(m.version), None
        else:
            kind, task_id, version, promise = "unblock", None, None, json_text(m.promise)
        return (
            r.id,
            r.entry.address,
            kind,
            task_id,
            version,
            promise,
            i(r.created_at),
            str(r.state),
            r.attempts,
            i(r.available_at),
            r.claim_token,
            r.claimed_by,
            i(r.claimed_at),
            r.last_code,
            i(r.updated_at),
        )

    def outbox_row(self, r: Sequence[Any]) -> OutboxRow:
        """A stored outbox row (columns in :data:`OUTBOX_COLUMNS` order)."""
        o = self.int_out
        if r[2] == "execute":
            message: Execute | Unblock = Execute(r[3], o(r[4]))
        else:
            message = Unblock(_decode_record(r[5]))
        return OutboxRow(
            id=r[0],
            entry=OutboxEntry(r[1], message),
            created_at=o(r[6]),
            state=r[7],
            attempts=r[8],
            available_at=o(r[9]),
            claim_token=r[10],
            claimed_by=r[11],
            claimed_at=o(r[12]),
            last_code=r[13],
            updated_at=o(r[14]),
        )
