"""Request ``data`` shapes for every kind (SPEC.md §2.4, SDK-CLIENTS.md §2.3).

Decoding is strict about types (a wrong type is a 400 with msgspec's message, which
names the field) and lenient about extras (unknown fields are ignored, as the
reference server does).  Optional fields that real clients omit (Python omits empty
values) default to the empty value.  Naturals are ``ge=0``.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from troth.protocol.records import EMPTY_VALUE, Tags, Value

Nat = Annotated[int, msgspec.Meta(ge=0)]


class Req(msgspec.Struct, frozen=True, rename="camel"):
    """Base of every request body."""


class PromiseGet(Req, frozen=True):
    id: str


class PromiseCreate(Req, frozen=True):
    id: str
    timeout_at: Nat
    param: Value = EMPTY_VALUE
    tags: Tags = msgspec.field(default_factory=dict)


class PromiseSettle(Req, frozen=True):
    id: str
    state: str
    value: Value = EMPTY_VALUE


class PromiseRegisterCallback(Req, frozen=True):
    awaited: str
    awaiter: str


class PromiseRegisterListener(Req, frozen=True):
    awaited: str
    address: str


class PromiseSearch(Req, frozen=True):
    state: str | None = None
    tags: Tags = msgspec.field(default_factory=dict)
    limit: int | None = None
    cursor: str | None = None
    id_prefix: str | None = None  # troth: only ids starting with it (docs/protocol.md)


class TaskGet(Req, frozen=True):
    id: str


class Action(msgspec.Struct, frozen=True):
    """A nested request envelope (``task.create``/``fence``/``suspend``/``fulfill``)."""

    kind: str
    data: msgspec.Raw
    head: dict[str, Any] = msgspec.field(default_factory=dict)


class TaskCreate(Req, frozen=True):
    pid: str
    ttl: Nat
    action: Action


class TaskAcquire(Req, frozen=True):
    id: str
    version: Nat
    pid: str
    ttl: Nat


class TaskFence(Req, frozen=True):
    id: str
    version: Nat
    action: Action


class TaskRef(msgspec.Struct, frozen=True):
    id: str
    version: Nat


class TaskHeartbeat(Req, frozen=True):
    pid: str
    tasks: list[TaskRef] = msgspec.field(default_factory=list)


class TaskSuspend(Req, frozen=True):
    id: str
    version: Nat
    actions: list[Action]


class FulfillSettle(Req, frozen=True):
    """``task.fulfill``'s inner settle: its ``id`` is not consulted (§10.11)."""

    state: str
    value: Value = EMPTY_VALUE
    id: str | None = None


class TaskFulfill(Req, frozen=True):
    id: str
    version: Nat
    action: Action


class TaskRelease(Req, frozen=True):
    id: str
    version: Nat


class TaskHalt(Req, frozen=True):
    id: str


class TaskContinue(Req, frozen=True):
    id: str


class TaskSearch(Req, frozen=True):
    state: str | None = None
    limit: int | None = None
    cursor: str | None = None
    id_prefix: str | None = None  # troth: only ids starting with it (docs/protocol.md)


class ScheduleGet(Req, frozen=True):
    id: str


class ScheduleCreate(Req, frozen=True):
    id: str
    cron: str
    promise_id: str
    promise_timeout: Nat
    promise_param: Value = EMPTY_VALUE
    promise_tags: Tags = msgspec.field(default_factory=dict)


class ScheduleDelete(Req, frozen=True):
    id: str


class ScheduleSearch(Req, frozen=True):
    tags: Tags = msgspec.field(default_factory=dict)
    limit: int | None = None
    cursor: str | None = None
    id_prefix: str | None = None  # troth: only ids starting with it (docs/protocol.md)


class DebugEmpty(Req, frozen=True):
    pass


class DebugTick(Req, frozen=True):
    time: Nat


REQUEST_TYPES: dict[str, type[Req]] = {
    "promise.get": PromiseGet,
    "promise.create": PromiseCreate,
    "promise.settle": PromiseSettle,
    "promise.register_callback": PromiseRegisterCallback,
    "promise.register_listener": PromiseRegisterListener,
    "promise.search": PromiseSearch,
    "task.get": TaskGet,
    "task.create": TaskCreate,
    "task.acquire": TaskAcquire,
    "task.fence": TaskFence,
    "task.heartbeat": TaskHeartbeat,
    "task.suspend": TaskSuspend,
    "task.fulfill": TaskFulfill,
    "task.release": TaskRelease,
    "task.halt": TaskHalt,
    "task.continue": TaskContinue,
    "task.search": TaskSearch,
    "schedule.get": ScheduleGet,
    "schedule.create": ScheduleCreate,
    "schedule.delete": ScheduleDelete,
    "schedule.search": ScheduleSearch,
    "debug.start": DebugEmpty,
    "debug.stop": DebugEmpty,
    "debug.reset": DebugEmpty,
    "debug.snap": DebugEmpty,
    "debug.tick": DebugTick,
}

_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    kind: msgspec.json.Decoder(t) for kind, t in REQUEST_TYPES.items()
}


class BadRequest(Exception):
    """Input the protocol refuses with 400; the message goes to the client verbatim."""


def decode_data(kind: str, raw: bytes | msgspec.Raw) -> Req:
    """Decode one request body for ``kind``; raises :class:`BadRequest` with the reason."""
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise BadRequest(f"Unknown operation: {kind}")
    try:
        req: Req = decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"Invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BadRequest(f"Invalid request: {exc}") from None
    except RecursionError:  # the server checks depth first; this is the backstop
        raise BadRequest("Invalid request: JSON nests too deep") from None
    return req


def decode_action(action: Action, expected: tuple[str, ...]) -> Req:
    """Decode a nested action, checking its kind is one the outer request allows."""
    if action.kind not in expected:
        raise BadRequest(f"Invalid action kind {action.kind!r}: expected {' or '.join(expected)}")
    if action.kind == "promise.settle" and expected == ("promise.settle",):
        try:
            return msgspec.json.decode(action.data, type=FulfillSettle)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise BadRequest(f"Invalid request: {exc} (in action)") from None
        except RecursionError:
            raise BadRequest("Invalid request: JSON nests too deep (in action)") from None
    try:
        return decode_data(action.kind, action.data)
    except BadRequest as exc:
        raise BadRequest(f"{exc} (in action)") from None
