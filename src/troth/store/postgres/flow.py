"""The flow-control tables of one PostgreSQL transaction (``troth/flow``): reads,
and the statements of a job's flow-control writes.

A limited group's row is locked once per transaction and read with its lock
(:meth:`FlowTables.flow_lock`); what that read found answers the group's counts
until the transaction's next flow-control write.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from troth.flow.limits import Held, Limit, held_row, limit_row, stored_held, stored_limit
from troth.store.backend import Backend
from troth.store.postgres.rows import Q
from troth.store.postgres.session import Cur
from troth.store.writes import Writes


class FlowTables(Backend):
    """The flow-control reads and writes of
    :class:`~troth.store.postgres.backend.PostgresBackend`, over its cursor, its
    deferred writes (:meth:`flush`, ``pending_messages``) and what it holds of the
    flow-control tables (``slots``, ``flow_state``)."""

    cur: Cur
    pending_messages: dict[str, tuple[Any, ...]]
    slots: dict[str, str | None]
    flow_state: dict[str, tuple[float, int, int]]

    @abstractmethod
    def flush(
        self, *, commit: bool = False, fetch: tuple[str, Any] | None = None, begin: bool = False
    ) -> list[Any] | None: ...

    def flow_limits(self) -> list[Limit]:
        self.flush()
        rows = self.cur.execute(Q["flow_limits"]).fetchall()
        return [stored_limit(*row) for row in rows]

    def flow_tat(self, group: str) -> float:
        state = self.flow_state.get(group)
        if state is not None:
            return state[0]
        self.flush()
        r = self.cur.execute(Q["flow_tat"], (group,)).fetchone()
        return 0.0 if r is None else float(r[0])

    def flow_lock(self, group: str) -> None:
        """Lock the group's row and read its state with it (one round trip); again in
        the same transaction, nothing to send while no flow-control write came since."""
        if group in self.flow_state:
            return
        self.flush()
        r = self.cur.execute(Q["flow_lock"], (group,)).fetchone()
        if r is not None:
            self.flow_state[group] = (float(r[0]), int(r[1]), int(r[2]))

    def flow_place(self, task_id: str, group: str, key: str) -> tuple[Held | None, int]:
        self.flush()
        r = self.cur.execute(Q["flow_place"], (group, group, key, task_id)).fetchone()
        assert r is not None  # one row, always
        queued = None if r[1] is None else stored_held(*r[1:])
        return queued, int(r[0] or 0)

    def flow_slot(self, task_id: str) -> str | None:
        if task_id in self.slots:
            return self.slots[task_id]
        self.flush()
        r = self.cur.execute(Q["flow_slot"], (task_id,)).fetchone()
        found = None if r is None else str(r[0])
        self.slots[task_id] = found
        return found

    def flow_in_use(self, group: str) -> int:
        state = self.flow_state.get(group)
        if state is not None:
            return state[2]
        self.flush()
        return self._count(Q["flow_in_use"], group)

    def flow_slots_of(self, group: str) -> list[str]:
        self.flush()
        return [str(r[0]) for r in self.cur.execute(Q["flow_slots_of"], (group,)).fetchall()]

    def flow_held(self, group: str, limit: int, offset: int = 0) -> list[Held]:
        self.flush()
        rows = self.cur.execute(Q["flow_held"], (group, limit, offset)).fetchall()
        return [stored_held(*row) for row in rows]

    def flow_queued(self, task_id: str) -> Held | None:
        self.flush()
        r = self.cur.execute(Q["flow_queued"], (task_id,)).fetchone()
        return None if r is None else stored_held(*r)

    def flow_key_in_use(self, group: str, key: str) -> int:
        self.flush()
        r = self.cur.execute(Q["flow_key_in_use"], (group, key)).fetchone()
        return 0 if r is None else int(r[0])

    def flow_key_turn(self, group: str, key: str) -> int:
        self.flush()
        r = self.cur.execute(Q["flow_key_turn"], (group, key)).fetchone()
        return 0 if r is None or r[0] is None else int(r[0])

    def flow_turn(self, group: str) -> int:
        state = self.flow_state.get(group)
        if state is not None:
            return state[1]
        self.flush()
        r = self.cur.execute(Q["flow_turn"], (group,)).fetchone()
        return 0 if r is None else int(r[0])

    def flow_held_count(self, group: str) -> int:
        self.flush()
        return self._count(Q["flow_held_count"], group)

    def _count(self, sql: str, group: str) -> int:
        r = self.cur.execute(sql, (group,)).fetchone()
        return 0 if r is None else int(r[0])

    def _flow_statements(self, writes: Writes, now: int) -> list[tuple[str, Any]]:
        self.flow_state.clear()  # counts and buckets change: read them again (locked)
        statements: list[tuple[str, Any]] = []
        for key in sorted(writes.withdrawn or ()):
            self.pending_messages.pop(key, None)
            statements.append((Q["flow_withdraw"], (key,)))
        keys = writes.slot_keys or {}
        for task_id, group in sorted((writes.slots or {}).items()):
            self.slots[task_id] = group
            if group is None:
                statements.append((Q["flow_delete_slot"], (task_id,)))
            else:
                row = (task_id, group, keys.get(task_id, ""))
                statements.append((Q["flow_put_slot"], row))
        for task_id, held in sorted((writes.held or {}).items()):
            if held is None:
                statements.append((Q["flow_delete_held"], (task_id,)))
            else:
                statements.append((Q["flow_put_held"], held_row(held)))
        for group, limit in sorted((writes.limits or {}).items()):
            if limit is None:
                statements.append((Q["flow_delete_limit"], (group,)))
                statements.append((Q["flow_delete_group_slots"], (group,)))
                self.slots = {t: g for t, g in self.slots.items() if g != group}
            else:
                statements.append((Q["flow_put_limit"], limit_row(limit, now)))
        for group, tat in sorted((writes.tats or {}).items()):
            statements.append((Q["flow_put_tat"], (tat, group)))
        for group, turn in sorted((writes.turns or {}).items()):
            statements.append((Q["flow_put_turn"], (turn, group)))
        return statements
