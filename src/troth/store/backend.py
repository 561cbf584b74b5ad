"""What a backend provides: one transaction's reads (points, scans, due lists, the
flow-control tables) and :meth:`Backend.apply` of one job's writes.  Each store
(memory, SQLite, PostgreSQL) implements it; group commit (``store/base.py``) and
the jobs' overlays (``store/overlay.py``) are written once above it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection

from troth.flow.limits import Held, Limit
from troth.protocol.records import EARLIEST, Promise, Schedule, Tags, Task
from troth.store.writes import Writes


class Backend(ABC):
    """One open transaction of a backend: reads, scans, and applying writes."""

    @abstractmethod
    def get_promise(self, id: str) -> Promise | None: ...

    @abstractmethod
    def get_task(self, id: str) -> Task | None: ...

    @abstractmethod
    def get_schedule(self, id: str) -> Schedule | None: ...

    @abstractmethod
    def scan_promises(
        self, states: Collection[str] | None, tags: Tags, after: str | None, limit: int
    ) -> list[Promise]: ...

    @abstractmethod
    def scan_tasks(
        self, states: Collection[str] | None, after: str | None, limit: int
    ) -> list[Task]: ...

    @abstractmethod
    def scan_schedules(self, tags: Tags, after: str | None, limit: int) -> list[Schedule]: ...

    @abstractmethod
    def promises_in_branch(self, branch: str, limit: int) -> list[Promise]: ...

    @abstractmethod
    def due_promises(self, now: int, limit: int, since: int = EARLIEST) -> list[str]: ...

    @abstractmethod
    def due_tasks(self, now: int, limit: int, since: int = EARLIEST) -> list[str]: ...

    @abstractmethod
    def due_schedules(self, now: int, limit: int, since: int = EARLIEST) -> list[str]: ...

    @abstractmethod
    def undrained_promises(self, limit: int) -> list[str]: ...

    @abstractmethod
    def next_deadline(self) -> int | None: ...

    @abstractmethod
    def apply(self, writes: Writes, now: int) -> None:
        """Write one job's effects; outbox entries are keyed upserts of *pending* rows."""

    def get_trace(self, id: str) -> str | None:
        """The trace context promise ``id`` was created in (``Writes.traces``), or
        None: tracing was off then, or there is no such promise.  Asked only with
        tracing on (``server/tracing.py``); a store that keeps none has none."""
        return None

    # -- flow control (troth/flow): read only while some group has a limit ----------

    def flow_limits(self) -> list[Limit]:
        """Every limit, by group."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_slot(self, task_id: str) -> str | None:
        """The group whose slot the task holds, or None."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_in_use(self, group: str) -> int:
        """How many tasks hold a slot of ``group``."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_tat(self, group: str) -> float:
        """The token bucket of the group's rate limit (``Writes.tats``; 0: full)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_lock(self, group: str) -> None:
        """Take the group's turn: until this transaction ends, no other counts or
        admits for ``group`` (a store shared between nodes locks its limit row; a
        store with one writer has nothing to do)."""
        return None

    def flow_slots_of(self, group: str) -> list[str]:
        """The tasks that hold a slot of ``group``, by id."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_held(self, group: str, limit: int, offset: int = 0) -> list[Held]:
        """``limit`` tasks queued for a slot of ``group``, in queue order (higher
        priority first, then turn, then first created, then by id), after the first
        ``offset``."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_queued(self, task_id: str) -> Held | None:
        """The task's place in its group's queue, or None: it is not queued."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_key_in_use(self, group: str, key: str) -> int:
        """How many tasks of ``key`` hold a slot of ``group``."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_key_turn(self, group: str, key: str) -> int:
        """The last turn of the tasks of ``key`` queued in ``group`` (0: none)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_turn(self, group: str) -> int:
        """The turn of the last task of ``group`` let through (0: none yet)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")

    def flow_place(self, task_id: str, group: str, key: str) -> tuple[Held | None, int]:
        """Where a task stands in its group's queue (None: not queued), and the last
        turn a new task of ``key`` queues behind: the group's, or its key's last
        queued one, whichever is later.  One read where a store can (PostgreSQL)."""
        turn = max(self.flow_turn(group), self.flow_key_turn(group, key))
        return self.flow_queued(task_id), turn

    def flow_held_count(self, group: str) -> int:
        """How many tasks are queued for a slot of ``group``."""
        raise NotImplementedError(f"{type(self).__name__} keeps no limits")
