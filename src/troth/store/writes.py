"""One job's effects, as the machine left them in its overlay."""

from __future__ import annotations

from dataclasses import dataclass, field

from troth.flow.limits import Held, Limit
from troth.protocol.records import OutboxEntry, Promise, Schedule, Task


@dataclass
class Writes:
    """The effects of one job, as keyed upserts (schedules: ``None`` = deleted)."""

    promises: dict[str, Promise] = field(default_factory=dict)
    tasks: dict[str, Task] = field(default_factory=dict)
    schedules: dict[str, Schedule | None] = field(default_factory=dict)
    messages: dict[str, OutboxEntry] = field(default_factory=dict)
    #: When a message of ``messages`` may first be claimed, by key, where not at once
    #: (the job's ``now``): the server's backoff of a task that keeps bouncing
    #: (``server/delivery/bounces.py``).  Set by the server after the machine ran, never by it.
    available_at: dict[str, int] = field(default_factory=dict)
    #: The trace context (W3C ``traceparent``) to keep with the promises this job
    #: wrote, by id, where a promise has none yet: set by the server after the
    #: machine ran, with tracing on (``server/tracing.py``); None (no dict made for
    #: every job) with it off.
    traces: dict[str, str] | None = None
    #: Flow control (``troth/flow``), set by the server after the machine ran, only
    #: while some group has a limit (None, no dict made, otherwise): the slots taken
    #: (task id -> group) and freed (None), the tasks queued for a slot and those
    #: leaving the queue (None), and the limits set and deleted (None) by group.
    slots: dict[str, str | None] | None = None
    held: dict[str, Held | None] | None = None
    limits: dict[str, Limit | None] | None = None
    #: The token buckets of rate limits after this job's starts, by group (the
    #: *theoretical arrival time* in ms, ``flow.limits.next_start``).
    tats: dict[str, float] | None = None
    #: The ``troth:key`` of a slot taken (``slots``), by task id, where it has one.
    slot_keys: dict[str, str] | None = None
    #: The turn of the last task let through, by group (``flow.limits.Held``).
    turns: dict[str, int] | None = None
    #: Keys whose pending outbox message is withdrawn (a task queued for a slot:
    #: an ``execute`` written for it earlier and not yet sent goes too).
    withdrawn: set[str] | None = None

    def __bool__(self) -> bool:
        return bool(
            self.promises
            or self.tasks
            or self.schedules
            or self.messages
            or self.slots
            or self.held
            or self.limits
            or self.withdrawn
            or self.tats
            or self.turns
        )

    def has_flow(self) -> bool:
        """Whether the job changed anything of flow control (``troth/flow``)."""
        return bool(
            self.slots or self.held or self.limits or self.withdrawn or self.tats or self.turns
        )
