"""Wire records of the protocol (SPEC.md §2.1) and the store objects behind them (§2.2).

Store objects are frozen msgspec Structs: the machine never mutates one, it builds a
new value and hands it to the transaction.  That is what lets a request's writes be
thrown away whole when the request fails (group commit isolates neighbours that way).

The wire encoding is camelCase and omits absent optional fields (never ``null``);
fields that the clients require (``param``, ``value``, ``tags``, ``resumes``) have no
default, so they are always written.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

import msgspec
from msgspec.structs import astuple

Tags = dict[str, str]


class PromiseState(StrEnum):
    """A promise's state (§2.2); stored and sent as the lower-case string."""

    PENDING = "pending"
    RESOLVED = "resolved"
    REJECTED = "rejected"
    REJECTED_CANCELED = "rejected_canceled"
    REJECTED_TIMEDOUT = "rejected_timedout"


class TaskState(StrEnum):
    """A task's state (§2.2); stored and sent as the lower-case string."""

    PENDING = "pending"
    ACQUIRED = "acquired"
    SUSPENDED = "suspended"
    HALTED = "halted"
    FULFILLED = "fulfilled"


# The machine's names for them, read like the specification (``p.state == PENDING``):
# plain strings (``.value``), so records hold ``str`` exactly — the fast path of msgspec,
# sqlite3 and psycopg, which take a str subclass the slow way.
PENDING: Final = PromiseState.PENDING.value
RESOLVED: Final = PromiseState.RESOLVED.value
REJECTED: Final = PromiseState.REJECTED.value
REJECTED_CANCELED: Final = PromiseState.REJECTED_CANCELED.value
REJECTED_TIMEDOUT: Final = PromiseState.REJECTED_TIMEDOUT.value

PROMISE_STATES: Final[frozenset[str]] = frozenset(s.value for s in PromiseState)
SETTABLE_STATES: Final[frozenset[str]] = frozenset({RESOLVED, REJECTED, REJECTED_CANCELED})
TASK_STATES: Final[frozenset[str]] = frozenset(s.value for s in TaskState)

#: Before every instant a record carries (ms since the epoch; PostgreSQL's least
#: ``int8``): the lower bound of a due list that leaves nothing out (``Tx.due_tasks``).
EARLIEST: Final = -(2**63)

TAG_TARGET: Final = "resonate:target"
TAG_TIMER: Final = "resonate:timer"
TAG_EXTERNAL: Final = "resonate:external"
TAG_SCOPE: Final = "resonate:scope"
TAG_DELAY: Final = "resonate:delay"
TAG_BRANCH: Final = "resonate:branch"
TAG_SCHEDULE: Final = "resonate:schedule"
TAG_ORIGIN: Final = "resonate:origin"
TAG_PARENT: Final = "resonate:parent"


class Value(msgspec.Struct, frozen=True, omit_defaults=True):
    """A payload: headers and opaque data. ``{}`` on the wire is the empty value."""

    headers: dict[str, str] = msgspec.field(default_factory=dict)
    data: str | None = None


EMPTY_VALUE: Final = Value()


class PromiseRecord(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """What responses and ``unblock`` messages carry: a promise without its ledgers."""

    id: str
    state: str
    param: Value
    value: Value
    tags: Tags
    timeout_at: int
    created_at: int
    settled_at: int | None = None


_RECORD_FIELDS: Final = len(PromiseRecord.__struct_fields__)


class Promise(PromiseRecord, frozen=True):
    """The stored promise: the record plus its two obligation ledgers (§2.2)."""

    callbacks: tuple[str, ...] = ()
    listeners: tuple[str, ...] = ()

    def record(self) -> PromiseRecord:
        """The record without the ledgers (its fields are this struct's first ones)."""
        return PromiseRecord(*astuple(self)[:_RECORD_FIELDS])

    @property
    def pending(self) -> bool:
        return self.state == PENDING

    @property
    def is_timer(self) -> bool:
        return self.tags.get(TAG_TIMER) == "true"

    @property
    def targeted(self) -> bool:
        return TAG_TARGET in self.tags

    @property
    def external(self) -> bool:
        return is_external(self.tags)


class TaskRecord(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """What responses carry: ``resumes`` is a count, lease deadlines are hidden."""

    id: str
    state: str
    version: int
    resumes: int
    ttl: int | None = None
    pid: str | None = None


class Task(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """The stored task, co-keyed with its promise (§2.2)."""

    id: str
    state: str
    version: int
    ttl: int | None = None
    pid: str | None = None
    expires_at: int | None = None
    retry_at: int | None = None
    resumes: tuple[str, ...] = ()

    def record(self) -> TaskRecord:
        return TaskRecord(
            id=self.id,
            state=self.state,
            version=self.version,
            resumes=len(self.resumes),
            ttl=self.ttl,
            pid=self.pid,
        )


class Schedule(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """A schedule is stored and returned whole (no projection)."""

    id: str
    cron: str
    promise_id: str
    promise_timeout: int
    promise_param: Value
    promise_tags: Tags
    created_at: int
    next_run_at: int
    last_run_at: int | None = None


class Execute(msgspec.Struct, frozen=True, tag_field="kind", tag="execute", rename="camel"):
    """Tell a target to acquire ``task_id`` at ``version``."""

    task_id: str
    version: int


class Unblock(msgspec.Struct, frozen=True, tag_field="kind", tag="unblock"):
    """Tell a listener that a promise it registered on has settled."""

    promise: PromiseRecord


Message = Execute | Unblock


class OutboxEntry(msgspec.Struct, frozen=True):
    """One message for one address; its key makes ``set_message`` an upsert."""

    address: str
    message: Message

    @property
    def key(self) -> str:
        return message_key(self.address, self.message)


def message_key(address: str, message: Message) -> str:
    """Seed 004: execute is keyed by task id, unblock by ``{promiseId}:notify:{address}``."""
    if isinstance(message, Execute):
        return message.task_id
    return f"{message.promise.id}:notify:{address}"


def is_external(tags: Tags) -> bool:
    """External promises may take callbacks and listeners and carry a durable deadline.

    SPEC.md §2.3: ``resonate:external`` exactly ``"true"``, or targeted, or a timer.
    troth adds ``resonate:scope`` exactly ``"global"`` (docs/protocol.md): the
    TypeScript SDK's ``ctx.promise()`` tags its awaitable promise only that way, and
    that SDK's in-process server counts it as external.  ``"local"`` (or any other
    value) is not.
    """
    return (
        tags.get(TAG_EXTERNAL) == "true"
        or TAG_TARGET in tags
        or tags.get(TAG_TIMER) == "true"
        or tags.get(TAG_SCOPE) == "global"
    )


def is_timer_targeted(tags: Tags) -> bool:
    """Timer and target together are refused at every birth door (§10.7)."""
    return tags.get(TAG_TIMER) == "true" and TAG_TARGET in tags


def parse_nat(text: str) -> int:
    """The specification's total ``parseNat``: never fails, non-digits give garbage.

    Each character contributes ``acc*10 + (ord(c) - ord('0'))`` with truncated
    subtraction, exactly as the Lean definition; ``""`` is 0.
    """
    acc = 0
    for ch in text:
        acc = acc * 10 + max(ord(ch) - ord("0"), 0)
    return acc
