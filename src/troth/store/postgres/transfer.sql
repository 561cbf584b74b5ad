-- What `troth migrate-store` (store/transfer.py) runs on the target database, beside
-- the store's own insert_promises / insert_tasks / insert_schedule (queries.sql).
-- Kept apart from queries.sql: only the one-off copy uses them, never a request.

-- Nothing may write the tables while they are filled and checked for emptiness: a
-- node that was left running against the target waits (or the copy gives up after
-- lock_timeout) instead of interleaving its rows with the copied ones.
-- name: lock_tables
LOCK TABLE promises, tasks, schedules, outbox IN EXCLUSIVE MODE

-- name: row_counts
SELECT (SELECT count(*) FROM promises), (SELECT count(*) FROM tasks),
    (SELECT count(*) FROM schedules), (SELECT count(*) FROM outbox)

-- Outbox rows as they are, lifecycle and id included (an id names one delivery in
-- logs and the operator API, and decides delivery order), with the parsed poll://
-- destination the store derives on every write (codec.destination).  Columns arrive
-- as parallel text arrays in binary format, numbers as exact text.
-- name: insert_outbox_rows
INSERT INTO outbox (key, id, address, kind, task_id, version, promise, created_at, state,
    attempts, available_at, claim_token, claimed_by, claimed_at, last_code, updated_at,
    dest_cast, dest_group, dest_id) SELECT m.key, m.id::bigint, m.address, m.kind, m.task_id,
    m.version::numeric, m.promise, m.created_at::numeric, m.state, m.attempts::integer,
    m.available_at::numeric, m.claim_token, m.claimed_by, m.claimed_at::numeric, m.last_code,
    m.updated_at::numeric, m.dest_cast, m.dest_group, m.dest_id FROM unnest(%b::text[],
    %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],
    %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],
    %b::text[], %b::text[], %b::text[], %b::text[]) AS m(key, id, address, kind, task_id,
    version, promise, created_at, state, attempts, available_at, claim_token, claimed_by,
    claimed_at, last_code, updated_at, dest_cast, dest_group, dest_id)

-- The next outbox id is past every id the source ever handed out (its high-water
-- mark, which may be above the largest id left: superseded rows were deleted).
-- name: advance_outbox_ids
SELECT setval(pg_get_serial_sequence('outbox', 'id'), %s, true)
