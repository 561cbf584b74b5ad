-- The SQLite store's queries, by name (loaded by troth/store/sql/queries.py).
-- Columns come in troth/store/sql/codec.py's orders.  Integers beyond 64 bits are BLOBs
-- (see store.py), which sort after every INTEGER: such a deadline is never due.

-- name: get_promise
SELECT id, state, param, value, tags, timeout_at, created_at, settled_at, callbacks, listeners
FROM promises WHERE id = ?

-- name: get_task
SELECT id, state, version, ttl, pid, expires_at, retry_at, resumes FROM tasks WHERE id = ?

-- name: get_schedule
SELECT id, cron, promise_id, promise_timeout, promise_param, promise_tags, created_at,
       next_run_at, last_run_at
FROM schedules WHERE id = ?

-- A settle (or a timeout) of a promise the batch read: only what it changes.
-- name: settle_promise
UPDATE promises SET state = ?, value = ?, settled_at = ?, undrained = ? WHERE id = ?

-- name: upsert_promise
INSERT INTO promises (id, state, param, value, tags, timeout_at, created_at, settled_at,
                      callbacks, listeners, external, branch, undrained, origin)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET state = excluded.state, param = excluded.param,
    value = excluded.value, tags = excluded.tags, timeout_at = excluded.timeout_at,
    created_at = excluded.created_at, settled_at = excluded.settled_at,
    callbacks = excluded.callbacks, listeners = excluded.listeners,
    external = excluded.external, branch = excluded.branch, undrained = excluded.undrained,
    origin = excluded.origin

-- name: upsert_task
INSERT INTO tasks (id, state, version, ttl, pid, expires_at, retry_at, resumes)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET state = excluded.state, version = excluded.version,
    ttl = excluded.ttl, pid = excluded.pid, expires_at = excluded.expires_at,
    retry_at = excluded.retry_at, resumes = excluded.resumes

-- name: upsert_schedule
INSERT INTO schedules (id, cron, promise_id, promise_timeout, promise_param, promise_tags,
                       created_at, next_run_at, last_run_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET cron = excluded.cron, promise_id = excluded.promise_id,
    promise_timeout = excluded.promise_timeout, promise_param = excluded.promise_param,
    promise_tags = excluded.promise_tags, created_at = excluded.created_at,
    next_run_at = excluded.next_run_at, last_run_at = excluded.last_run_at

-- name: delete_schedule
DELETE FROM schedules WHERE id = ?

-- The keyed upsert of the *pending* row: delete it, insert the new message as a
-- fresh row (a new id: it goes to the back of the queue, as in memory/backend.py).
-- name: delete_pending_message
DELETE FROM outbox WHERE key = ? AND state = 'pending'

-- name: insert_message
INSERT INTO outbox (key, address, kind, task_id, version, promise, created_at,
                    state, attempts, available_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', 0, ?8, ?7)

-- name: promises_in_branch
SELECT id, state, param, value, tags, timeout_at, created_at, settled_at, callbacks, listeners
FROM promises WHERE branch = ? ORDER BY id LIMIT ?

-- name: due_promises
SELECT id FROM promises WHERE state = 'pending' AND external = 1 AND timeout_at <= ?
ORDER BY timeout_at, id LIMIT ?

-- A task is either pending or acquired, so the two halves never share an id.  The
-- ORDER BY on the compound itself (not on a subquery) lets SQLite merge two ordered
-- index range scans instead of sorting.
-- name: due_tasks
SELECT id, retry_at FROM tasks WHERE state = 'pending' AND retry_at <= ?1
UNION ALL
SELECT id, expires_at FROM tasks WHERE state = 'acquired' AND expires_at <= ?1
ORDER BY 2, 1 LIMIT ?2

-- name: due_schedules
SELECT id FROM schedules WHERE next_run_at <= ? ORDER BY next_run_at, id LIMIT ?

-- name: undrained_promises
SELECT id FROM promises WHERE undrained = 1 ORDER BY id LIMIT ?

-- name: next_deadline
SELECT EXISTS (SELECT 1 FROM promises WHERE undrained = 1),
       (SELECT min(timeout_at) FROM promises WHERE state = 'pending' AND external = 1),
       (SELECT min(retry_at) FROM tasks WHERE state = 'pending'),
       (SELECT min(expires_at) FROM tasks WHERE state = 'acquired'),
       (SELECT min(next_run_at) FROM schedules)

-- The outbox lifecycle (store/outbox.py's OutboxTable).  Parameters of claim:
-- token, worker, now, now, now, limit.
-- name: claim
UPDATE outbox SET state = 'dispatching', claim_token = ?, claimed_by = ?,
    claimed_at = ?, updated_at = ?
WHERE id IN (SELECT id FROM outbox WHERE state = 'pending' AND available_at <= ?
             ORDER BY available_at, id LIMIT ?)
RETURNING id, address, kind, task_id, version, promise, created_at, state, attempts,
          available_at, claim_token, claimed_by, claimed_at, last_code, updated_at

-- name: held
SELECT key, attempts FROM outbox WHERE id = ? AND state = 'dispatching' AND claim_token = ?

-- name: in_state
SELECT key, attempts FROM outbox WHERE id = ? AND state = ?

-- name: has_pending
SELECT 1 FROM outbox WHERE key = ? AND state = 'pending'

-- name: finish
UPDATE outbox SET state = ?, attempts = ?, claim_token = NULL, last_code = ?,
    updated_at = ?
WHERE id = ?

-- name: requeue
UPDATE outbox SET state = 'pending', attempts = ?, claim_token = NULL, last_code = ?,
    updated_at = ?, available_at = ?
WHERE id = ?

-- name: unknown_rows
SELECT id, address, kind, task_id, version, promise, created_at, state, attempts,
       available_at, claim_token, claimed_by, claimed_at, last_code, updated_at
FROM outbox WHERE state = 'outcome_unknown' ORDER BY id LIMIT ?

-- The reaper: from the bottom, or (release_expired_since) from the last pass's cutoff,
-- by outbox_claimed as on PostgreSQL (its queries.sql says why).
-- name: release_expired
UPDATE outbox SET state = 'outcome_unknown', claim_token = NULL, last_code = ?,
    updated_at = ?
WHERE state = 'dispatching' AND claimed_at < ?

-- name: release_expired_since
UPDATE outbox SET state = 'outcome_unknown', claim_token = NULL, last_code = ?,
    updated_at = ?
WHERE state = 'dispatching' AND claimed_at >= ? AND claimed_at < ?

-- With PostgreSQL's bound on available_at (its queries.sql says why): the same rule on
-- every store.
-- name: purge_completed
DELETE FROM outbox WHERE state = 'completed' AND updated_at < ? AND available_at < ?

-- name: next_due
SELECT min(available_at) FROM outbox WHERE state = 'pending'

-- A pending row held back (the server's bounce backoff, a requeue) due as written,
-- i.e. at once: a worker connected.
-- Whether a newer execute was written for a task (store/outbox.py, retry_failed).
-- name: newer_execute
SELECT 1 FROM outbox WHERE task_id = ? AND id > ? LIMIT 1

-- name: expedite
UPDATE outbox SET available_at = created_at
WHERE key = ? AND state = 'pending' AND available_at > created_at

-- What no connection could take (store/outbox.py, OutboxStore.revive): pending rows
-- backed off past now for want of a connection, and failed rows whose attempts ran
-- out since a cutoff, but no execute of a task that has a newer one (sent or not;
-- found by outbox_task: an execute's key is its task id).
-- name: stranded
SELECT id, key, state, address, created_at FROM outbox AS o
WHERE (state = 'pending' AND available_at > ? AND last_code = ?)
    OR (state = 'failed' AND available_at >= ? AND last_code = ?
        AND NOT EXISTS (SELECT 1 FROM outbox AS n WHERE n.task_id = o.task_id AND n.id > o.id))

-- The trace context a promise was created in (tracing on: server/tracing.py).
-- name: get_trace
SELECT trace FROM promises WHERE id = ?

-- Kept from the first traced request that wrote the promise: a later one (a settle,
-- a re-create that deduplicates) leaves it.
-- name: set_trace
UPDATE promises SET trace = ? WHERE id = ? AND trace IS NULL

-- Flow control (troth/flow): read and written only while some group has a limit.
-- name: flow_limits
SELECT grp, concurrency, rate, burst, per_key FROM flow_limits ORDER BY grp

-- name: flow_slot
SELECT grp FROM flow_slots WHERE task_id = ?

-- name: flow_in_use
SELECT count(*) FROM flow_slots WHERE grp = ?

-- name: flow_held
SELECT task_id, grp, address, priority, created_at, fkey, turn FROM flow_held
WHERE grp = ? ORDER BY priority DESC, turn, created_at, task_id LIMIT ? OFFSET ?

-- name: flow_queued
SELECT task_id, grp, address, priority, created_at, fkey, turn FROM flow_held
WHERE task_id = ?

-- The last turn of a key's queued tasks (flow_held_key), and the group's: the turn of
-- the last task let through.
-- name: flow_key_turn
SELECT max(turn) FROM flow_held WHERE grp = ? AND fkey = ?

-- name: flow_turn
SELECT turn FROM flow_limits WHERE grp = ?

-- name: flow_put_turn
UPDATE flow_limits SET turn = ? WHERE grp = ?

-- name: flow_key_in_use
SELECT count(*) FROM flow_slots WHERE grp = ? AND fkey = ?

-- name: flow_held_count
SELECT count(*) FROM flow_held WHERE grp = ?

-- name: flow_put_slot
INSERT INTO flow_slots (task_id, grp, fkey) VALUES (?, ?, ?)
ON CONFLICT (task_id) DO UPDATE SET grp = excluded.grp, fkey = excluded.fkey

-- name: flow_delete_slot
DELETE FROM flow_slots WHERE task_id = ?

-- name: flow_put_held
INSERT INTO flow_held (task_id, grp, address, priority, created_at, fkey, turn)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (task_id) DO UPDATE SET grp = excluded.grp, address = excluded.address,
    priority = excluded.priority, created_at = excluded.created_at, fkey = excluded.fkey,
    turn = excluded.turn

-- name: flow_delete_held
DELETE FROM flow_held WHERE task_id = ?

-- name: flow_put_limit
INSERT INTO flow_limits (grp, concurrency, rate, burst, per_key, updated_at)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (grp) DO UPDATE SET concurrency = excluded.concurrency,
    rate = excluded.rate, burst = excluded.burst, per_key = excluded.per_key,
    updated_at = excluded.updated_at

-- A rate limit's token bucket: the theoretical arrival time of the next start (ms).
-- name: flow_tat
SELECT tat FROM flow_limits WHERE grp = ?

-- name: flow_put_tat
UPDATE flow_limits SET tat = ? WHERE grp = ?

-- name: flow_delete_limit
DELETE FROM flow_limits WHERE grp = ?

-- name: flow_delete_group_slots
DELETE FROM flow_slots WHERE grp = ?

-- name: flow_slots_of
SELECT task_id FROM flow_slots WHERE grp = ? ORDER BY task_id
