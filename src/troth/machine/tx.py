"""The only door between the machine and storage.

The machine reads and writes through this protocol and nothing else (ARCHITECTURE rule
1).  Every ``set_*`` is a keyed upsert, exactly the effects of SPEC.md §2.2; there is no
delete except for schedules.  Implementations give read-your-writes inside one
transaction and commit the writes atomically with the outbox rows.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from troth.protocol.records import EARLIEST, Message, Promise, Schedule, Tags, Task


class Tx(Protocol):
    """One transaction's view of the store."""

    def get_promise(self, id: str) -> Promise | None: ...

    def get_task(self, id: str) -> Task | None: ...

    def get_schedule(self, id: str) -> Schedule | None: ...

    def set_promise(self, promise: Promise) -> None: ...

    def set_task(self, task: Task) -> None: ...

    def set_schedule(self, schedule: Schedule) -> None: ...

    def del_schedule(self, id: str) -> None: ...

    def set_message(self, address: str, message: Message) -> None:
        """Keyed upsert into the outbox (seed 004 ``setMessage``)."""

    def scan_promises(
        self, states: Collection[str] | None, tags: Tags, after: str | None, limit: int
    ) -> list[Promise]:
        """Promises with id > ``after`` in id order whose stored state is in ``states``
        (None: any) and whose tags include every pair of ``tags``."""

    def scan_tasks(
        self, states: Collection[str] | None, after: str | None, limit: int
    ) -> list[Task]:
        """Tasks with id > ``after`` in id order whose stored state is in ``states``."""

    def scan_schedules(self, tags: Tags, after: str | None, limit: int) -> list[Schedule]:
        """Schedules with id > ``after`` in id order whose promise tags include ``tags``."""

    def promises_in_branch(self, branch: str, limit: int) -> list[Promise]:
        """Promises tagged ``resonate:branch = branch``, in id order (for ``preload``)."""

    # Deadline index: what the timer asks for.  Ids only; the machine re-checks every
    # guard itself, so a stale or generous answer is harmless (an armed deadline
    # means "not before").  ``since``: the timer knows no live deadline before it (its
    # floor, engine/timer.py); a store may leave out what is due before it, and one
    # whose index keeps dead entries (PostgreSQL while the horizon is held) must, so
    # that a pass does not walk them.

    def due_promises(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        """Pending external promises with ``since <= timeoutAt <= now``."""

    def due_tasks(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        """Pending tasks with ``retryAt`` and acquired ones with ``expiresAt`` in
        ``[since, now]``."""

    def due_schedules(self, now: int, limit: int, since: int = EARLIEST) -> list[str]:
        """Schedules with ``since <= nextRunAt <= now``."""

    def undrained_promises(self, limit: int) -> list[str]:
        """Settled promises whose callbacks or listeners are not yet drained (repair)."""

    def next_deadline(self) -> int | None:
        """The earliest stored deadline of any kind, or None when nothing is armed."""
