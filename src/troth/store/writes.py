"""One job's effects, as the machine left them in its overlay."""

from __future__ import annotations

from dataclasses import dataclass, field

from troth.protocol.records import OutboxEntry, Promise, Schedule, Task


@dataclass
class Writes:
    """The effects of one job, as keyed upserts (schedules: ``None`` = deleted)."""

    promises: dict[str, Promise] = field(default_factory=dict)
    tasks: dict[str, Task] = field(default_factory=dict)
    schedules: dict[str, Schedule | None] = field(default_factory=dict)
    messages: dict[str, OutboxEntry] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.promises or self.tasks or self.schedules or self.messages)
