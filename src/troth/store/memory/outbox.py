"""The memory store's outbox dict as the outbox lifecycle's table (``store/outbox.py``)."""

from __future__ import annotations

import dataclasses

from troth.outbox import codes
from troth.outbox.rows import OutboxRow, RowState
from troth.protocol.records import Execute
from troth.store.memory.backend import MemoryBackend
from troth.store.outbox import OutboxTable


class MemoryOutboxTable(OutboxTable):
    """The outbox dict; ``pending_by_key`` is SQL's partial unique index on pending keys."""

    def __init__(self, b: MemoryBackend) -> None:
        self.b = b

    def claim(self, worker_id: str, now: int, limit: int, token: str) -> list[OutboxRow]:
        out: list[OutboxRow] = []
        # The pending rows are those ``pending_by_key`` names (SQL's partial index):
        # delivered rows, kept an hour, are not walked at every claim.
        outbox = self.b.outbox
        due = [
            row
            for row in (outbox[i] for i in self.b.pending_by_key.values())
            if row.available_at <= now
        ]
        due.sort(key=lambda r: (r.available_at, r.id))
        for row in due:
            if len(out) == limit:
                break
            row.state = RowState.DISPATCHING
            row.claim_token = token
            row.claimed_by = worker_id
            row.claimed_at = now
            row.updated_at = now
            self.b.pending_by_key.pop(row.key, None)
            out.append(dataclasses.replace(row))
        return out

    def find(self, row_id: int, state: RowState, token: str | None) -> tuple[str, int] | None:
        row = self.b.outbox.get(row_id)
        if row is None or row.state != state or row.claim_token != token:
            return None
        return row.key, row.attempts

    def has_pending(self, key: str) -> bool:
        return key in self.b.pending_by_key

    def finish(
        self, row_id: int, state: RowState, attempts: int, code: str | None, now: int
    ) -> None:
        row = self.b.outbox[row_id]
        row.state = state
        row.attempts = attempts
        row.claim_token = None
        row.last_code = code
        row.updated_at = now

    def requeue(
        self, row_id: int, attempts: int, code: str | None, now: int, available_at: int
    ) -> None:
        self.finish(row_id, RowState.PENDING, attempts, code, now)
        row = self.b.outbox[row_id]
        row.available_at = available_at
        self.b.pending_by_key[row.key] = row_id

    def unknown_rows(self, limit: int) -> list[OutboxRow]:
        found = [r for r in self.b.outbox.values() if r.state == RowState.OUTCOME_UNKNOWN]
        return [dataclasses.replace(r) for r in sorted(found, key=lambda r: r.id)[:limit]]

    def release_expired(self, cutoff: int, now: int, code: str, since: int | None = None) -> int:
        n = 0
        for row in self.b.outbox.values():
            claimed = row.claimed_at
            if (
                row.state == RowState.DISPATCHING
                and claimed is not None
                and claimed < cutoff
                and (since is None or claimed >= since)
            ):
                self.finish(row.id, RowState.OUTCOME_UNKNOWN, row.attempts, code, now)
                n += 1
        return n

    def purge_completed(self, before: int) -> int:
        old = [
            r.id
            for r in self.b.outbox.values()
            if r.state == RowState.COMPLETED and r.updated_at < before and r.available_at < before
        ]
        for i in old:
            del self.b.outbox[i]
        return len(old)

    def next_due(self) -> int | None:
        outbox = self.b.outbox
        return min((outbox[i].available_at for i in self.b.pending_by_key.values()), default=None)

    def stranded(self, now: int, since: int) -> list[tuple[int, str, str, str, int]]:
        newest: dict[str, int] = {}  # by task id: an execute's key
        for r in self.b.outbox.values():
            if isinstance(r.entry.message, Execute):
                newest[r.key] = max(newest.get(r.key, r.id), r.id)
        return [
            (r.id, r.key, str(r.state), r.entry.address, r.created_at)
            for r in self.b.outbox.values()
            if (
                r.state == RowState.PENDING
                and r.available_at > now
                and r.last_code == codes.NO_CONNECTION
            )
            or (
                r.state == RowState.FAILED
                and r.available_at >= since
                and r.last_code == codes.ATTEMPTS_EXHAUSTED
                and newest.get(r.key, r.id) == r.id
            )
        ]

    def newer_execute(self, task_id: str, row_id: int) -> bool:
        return any(
            r.id > row_id and isinstance(r.message, Execute) and r.message.task_id == task_id
            for r in self.b.outbox.values()
        )

    def expedite(self, key: str) -> int:
        row_id = self.b.pending_by_key.get(key)
        row = None if row_id is None else self.b.outbox.get(row_id)
        if row is None or row.available_at <= row.created_at:
            return 0
        row.available_at = row.created_at
        return 1
