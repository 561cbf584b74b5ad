-- The PostgreSQL store's queries, by name (loaded by troth/store/sql/queries.py).
-- Columns come in troth/store/sql/codec.py's orders; instants, versions and ttls are
-- NUMERIC (exact, unbounded).  Placeholders are psycopg's (%s, %(name)s, %b binary).

-- name: get_promise
SELECT id, state, param, value, tags, timeout_at, created_at, settled_at, callbacks,
    listeners FROM promises WHERE id = %s FOR UPDATE

-- The uncorrelated sub-select runs once, as a one-time filter before the task is
-- scanned, so the promise is locked before the task (docs/architecture.md).
-- name: get_task
SELECT id, state, version, ttl, pid, expires_at, retry_at, resumes FROM tasks WHERE id =
    %(id)s AND (SELECT count(*) FROM (SELECT 1 FROM promises WHERE id = %(id)s FOR UPDATE)
    AS p) >= 0 FOR UPDATE OF tasks

-- name: get_schedule
SELECT id, cron, promise_id, promise_timeout, promise_param, promise_tags, created_at,
    next_run_at, last_run_at FROM schedules WHERE id = %s FOR UPDATE

-- The same point reads for reads served off the writer (``PostgresStore.read_many``): in
-- a READ ONLY snapshot, locking nothing, so a read never waits for a request's row.
-- name: read_promise
SELECT id, state, param, value, tags, timeout_at, created_at, settled_at, callbacks,
    listeners FROM promises WHERE id = %s

-- name: read_task
SELECT id, state, version, ttl, pid, expires_at, retry_at, resumes FROM tasks WHERE id =
    %(id)s

-- name: read_schedule
SELECT id, cron, promise_id, promise_timeout, promise_param, promise_tags, created_at,
    next_run_at, last_run_at FROM schedules WHERE id = %s

-- A batch of reads off the writer reads the rows its requests name in one round trip.
-- name: preread_promises
SELECT id, state, param, value, tags, timeout_at, created_at, settled_at, callbacks,
    listeners FROM promises WHERE id = ANY(%b)

-- name: preread_tasks
SELECT id, state, version, ttl, pid, expires_at, retry_at, resumes FROM tasks WHERE id =
    ANY(%b)

-- name: insert_promise
INSERT INTO promises (id, state, param, value, tags, timeout_at, created_at, settled_at,
    callbacks, listeners, external, branch, undrained, origin) VALUES (%s, %s, %s, %s, %s, %s,
    %s, %s, %s, %s, %s, %s, %s, %s)

-- name: upsert_promise
INSERT INTO promises (id, state, param, value, tags, timeout_at, created_at, settled_at,
    callbacks, listeners, external, branch, undrained, origin) VALUES (%s, %s, %s, %s, %s, %s,
    %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET state = excluded.state, param =
    excluded.param, value = excluded.value, tags = excluded.tags, timeout_at =
    excluded.timeout_at, created_at = excluded.created_at, settled_at = excluded.settled_at,
    callbacks = excluded.callbacks, listeners = excluded.listeners, external =
    excluded.external, branch = excluded.branch, undrained = excluded.undrained, origin =
    excluded.origin

-- name: insert_task
INSERT INTO tasks (id, state, version, ttl, pid, expires_at, retry_at, resumes) VALUES (%s,
    %s, %s, %s, %s, %s, %s, %s)

-- name: upsert_task
INSERT INTO tasks (id, state, version, ttl, pid, expires_at, retry_at, resumes) VALUES (%s,
    %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET state = excluded.state,
    version = excluded.version, ttl = excluded.ttl, pid = excluded.pid, expires_at =
    excluded.expires_at, retry_at = excluded.retry_at, resumes = excluded.resumes

-- name: insert_schedule
INSERT INTO schedules (id, cron, promise_id, promise_timeout, promise_param, promise_tags,
    created_at, next_run_at, last_run_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)

-- name: upsert_schedule
INSERT INTO schedules (id, cron, promise_id, promise_timeout, promise_param, promise_tags,
    created_at, next_run_at, last_run_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON
    CONFLICT (id) DO UPDATE SET cron = excluded.cron, promise_id = excluded.promise_id,
    promise_timeout = excluded.promise_timeout, promise_param = excluded.promise_param,
    promise_tags = excluded.promise_tags, created_at = excluded.created_at, next_run_at =
    excluded.next_run_at, last_run_at = excluded.last_run_at

-- name: delete_schedule
DELETE FROM schedules WHERE id = %s

-- Many rows per statement (a batch's deferred writes, coalesced per id): columns
-- arrive as parallel arrays in binary format, numbers as text (exact at any size)
-- cast to NUMERIC.
-- name: insert_promises
INSERT INTO promises (id, state, param, value, tags, timeout_at, created_at, settled_at,
    callbacks, listeners, external, branch, undrained, origin) SELECT * FROM unnest(%b::text[],
    %b::text[], %b::text[], %b::text[], %b::text[], %b::text[]::numeric[],
    %b::text[]::numeric[], %b::text[]::numeric[], %b::text[], %b::text[], %b::bool[],
    %b::text[], %b::bool[], %b::text[])

-- name: upsert_promises
INSERT INTO promises (id, state, param, value, tags, timeout_at, created_at, settled_at,
    callbacks, listeners, external, branch, undrained, origin) SELECT * FROM unnest(%b::text[],
    %b::text[], %b::text[], %b::text[], %b::text[], %b::text[]::numeric[],
    %b::text[]::numeric[], %b::text[]::numeric[], %b::text[], %b::text[], %b::bool[],
    %b::text[], %b::bool[], %b::text[]) ON CONFLICT (id) DO UPDATE SET state = excluded.state, param =
    excluded.param, value = excluded.value, tags = excluded.tags, timeout_at =
    excluded.timeout_at, created_at = excluded.created_at, settled_at = excluded.settled_at,
    callbacks = excluded.callbacks, listeners = excluded.listeners, external =
    excluded.external, branch = excluded.branch, undrained = excluded.undrained, origin =
    excluded.origin

-- name: insert_tasks
INSERT INTO tasks (id, state, version, ttl, pid, expires_at, retry_at, resumes) SELECT *
    FROM unnest(%b::text[], %b::text[], %b::text[]::numeric[], %b::text[]::numeric[],
    %b::text[], %b::text[]::numeric[], %b::text[]::numeric[], %b::text[])

-- name: upsert_tasks
INSERT INTO tasks (id, state, version, ttl, pid, expires_at, retry_at, resumes) SELECT *
    FROM unnest(%b::text[], %b::text[], %b::text[]::numeric[], %b::text[]::numeric[],
    %b::text[], %b::text[]::numeric[], %b::text[]::numeric[], %b::text[]) ON CONFLICT (id)
    DO UPDATE SET state = excluded.state, version = excluded.version, ttl = excluded.ttl,
    pid = excluded.pid, expires_at = excluded.expires_at, retry_at = excluded.retry_at,
    resumes = excluded.resumes

-- The keyed upsert of the *pending* row: a new message replaces it as a fresh row
-- (a new id from the sequence, so it goes to the back of the queue; every lifecycle
-- column reset).  Rows of the key in other states are not the arbiter's, so a
-- claimed row is never touched.
-- In emission order (WITH ORDINALITY): row ids decide delivery order.
-- name: upsert_messages
INSERT INTO outbox (key, address, kind, task_id, version, promise, created_at, state,
    attempts, available_at, updated_at, dest_cast, dest_group, dest_id) SELECT m.key,
    m.address, m.kind, m.task_id, m.version::numeric, m.promise, m.now::numeric, 'pending',
    0, m.due::numeric, m.now::numeric, m.cast_, m.grp, m.dest FROM unnest(%b::text[],
    %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],
    %b::text[], %b::text[], %b::text[]) WITH ORDINALITY AS m(key, address, kind, task_id,
    version, promise, now, due, cast_, grp, dest, ord) ORDER BY m.ord ON CONFLICT (key) WHERE state =
    'pending' DO UPDATE SET id = excluded.id, address = excluded.address, kind =
    excluded.kind, task_id = excluded.task_id, dest_cast = excluded.dest_cast, dest_group =
    excluded.dest_group, dest_id = excluded.dest_id, version = excluded.version, promise =
    excluded.promise, created_at = excluded.created_at, attempts = 0, available_at =
    excluded.available_at, claim_token = NULL, claimed_by = NULL, claimed_at = NULL,
    last_code = NULL, updated_at = excluded.updated_at

-- The batch's messages inserted already claimed (``PostgresBackend.claim_on_insert``):
-- what ``upsert_messages`` then ``claim`` in the same transaction leave, in one
-- statement and without updating each row again.  A pending row of a key is replaced
-- as the upsert replaces it (the new row takes its place, under a new id); the
-- inserted rows are not pending, so the partial unique index is not their arbiter.
-- name: insert_claimed_messages
WITH superseded AS (DELETE FROM outbox WHERE state = 'pending' AND key = ANY(%(keys)b::text[]))
    INSERT INTO outbox (key, address, kind, task_id, version, promise, created_at, state,
    attempts, available_at, updated_at, dest_cast, dest_group, dest_id, claim_token,
    claimed_by, claimed_at) SELECT m.key, m.address, m.kind, m.task_id, m.version::numeric,
    m.promise, m.now::numeric, 'dispatching', 0, m.due::numeric, %(now)s::numeric, m.cast_,
    m.grp, m.dest, %(token)s, %(worker)s, %(now)s::numeric FROM unnest(%(keys)b::text[],
    %(address)b::text[], %(kind)b::text[], %(task_id)b::text[], %(version)b::text[],
    %(promise)b::text[], %(created)b::text[], %(due)b::text[], %(cast_)b::text[],
    %(grp)b::text[], %(dest)b::text[]) WITH ORDINALITY AS m(key, address, kind, task_id,
    version, promise, now, due, cast_, grp, dest, ord) ORDER BY m.ord RETURNING id,
    address, kind, task_id, version, promise, created_at, state, attempts, available_at,
    claim_token, claimed_by, claimed_at, last_code, updated_at

-- name: promises_in_branch
SELECT id, state, param, value, tags, timeout_at, created_at, settled_at, callbacks,
    listeners FROM promises WHERE branch = %s ORDER BY id LIMIT %s

-- name: due_promises
SELECT id, state, param, value, tags, timeout_at, created_at, settled_at, callbacks,
    listeners FROM promises WHERE state = 'pending' AND external AND timeout_at <= %s AND
    timeout_at >= %s::numeric ORDER BY timeout_at, id LIMIT %s FOR UPDATE SKIP LOCKED

-- A task is either pending or acquired, so its one live deadline is a CASE; one
-- query (not SQLite's UNION ALL, which cannot take FOR UPDATE) keeps the LIMIT exact.
-- name: due_tasks
SELECT id, state, version, ttl, pid, expires_at, retry_at, resumes FROM tasks WHERE (state =
    'pending' AND retry_at <= %(now)s AND retry_at >= %(since)s::numeric) OR (state =
    'acquired' AND expires_at <= %(now)s AND expires_at >= %(since)s::numeric) ORDER BY
    CASE WHEN state = 'pending' THEN retry_at ELSE expires_at END, id LIMIT %(limit)s FOR
    UPDATE SKIP LOCKED

-- name: due_schedules
SELECT id FROM schedules WHERE next_run_at <= %s AND next_run_at >= %s::numeric ORDER BY
    next_run_at, id LIMIT %s FOR UPDATE SKIP LOCKED

-- name: undrained_promises
SELECT id FROM promises WHERE undrained ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED

-- Every sub-select is a walk of a small partial index.  The first is written as the
-- lowest undrained id rather than EXISTS: with statistics that saw many undrained rows
-- (a burst of settlements), EXISTS is planned as a sequential scan of all promises,
-- which it then walks to the end when none is undrained.
-- name: next_deadline
SELECT (SELECT id FROM promises WHERE undrained ORDER BY id LIMIT 1) IS NOT NULL,
    (SELECT min(timeout_at) FROM
    promises WHERE state = 'pending' AND external), (SELECT min(retry_at) FROM tasks WHERE
    state = 'pending'), (SELECT min(expires_at) FROM tasks WHERE state = 'acquired'),
    (SELECT min(next_run_at) FROM schedules)

-- next_deadline within [low, high] (the timer's read on PostgreSQL, engine/timer.py):
-- while a snapshot holds the horizon back, the low end of each partial index fills
-- with dead entries that a min() walks on every read; the bounds skip all but those
-- of the last few seconds.
-- name: next_deadline_within
SELECT (SELECT id FROM promises WHERE undrained ORDER BY id LIMIT 1) IS NOT NULL,
    (SELECT min(timeout_at) FROM promises WHERE state = 'pending' AND external AND
    timeout_at >= %(low)s::numeric AND timeout_at <= %(high)s::numeric), (SELECT
    min(retry_at) FROM tasks WHERE state = 'pending' AND retry_at >= %(low)s::numeric AND
    retry_at <= %(high)s::numeric), (SELECT min(expires_at) FROM tasks WHERE state =
    'acquired' AND expires_at >= %(low)s::numeric AND expires_at <= %(high)s::numeric),
    (SELECT min(next_run_at) FROM schedules WHERE next_run_at >= %(low)s::numeric AND
    next_run_at <= %(high)s::numeric)

-- MATERIALIZED: the locked id list is computed once, so the UPDATE can never see
-- more rows than the LIMIT took (an inlined IN-subquery may be re-scanned).
-- name: claim
WITH due AS MATERIALIZED (SELECT id FROM outbox WHERE state = 'pending' AND available_at <=
    %(now)s ORDER BY available_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) UPDATE outbox
    AS o SET state = 'dispatching', claim_token = %(token)s, claimed_by = %(worker)s,
    claimed_at = %(now)s, updated_at = %(now)s FROM due WHERE o.id = due.id RETURNING o.id,
    o.address, o.kind, o.task_id, o.version, o.promise, o.created_at, o.state, o.attempts,
    o.available_at, o.claim_token, o.claimed_by, o.claimed_at, o.last_code, o.updated_at

-- The claim of one node among several (server/delivery/cluster.py): besides http(s) rows,
-- the poll:// rows it can deliver itself, and those no live node can (tried, found
-- undeliverable and backed off, as on one node).  `others` is what the other live
-- nodes hold, by the database's clock.  Anycast with a preferred id goes first to
-- the node holding that id, else to any node holding the group.
-- name: claim_routed
WITH others AS MATERIALIZED (SELECT c.grp, c.pid FROM connections AS c JOIN nodes AS n ON
    n.node = c.node WHERE c.node <> %(node)s AND n.seen_at >= extract(epoch FROM
    clock_timestamp()) * 1000 - %(timeout)s), due AS MATERIALIZED (SELECT o.id FROM outbox
    AS o WHERE o.state = 'pending' AND o.available_at <= %(now)s AND ( o.dest_group IS NULL
    OR (o.dest_id IS NOT NULL AND o.dest_group || '/' || o.dest_id = ANY(%(pairs)b)) OR
    (o.dest_cast = 'uni' AND NOT EXISTS (SELECT 1 FROM others AS x WHERE x.grp =
    o.dest_group AND x.pid = o.dest_id)) OR (o.dest_cast = 'any' AND NOT EXISTS (SELECT 1
    FROM others AS x WHERE x.grp = o.dest_group AND x.pid = o.dest_id) AND (o.dest_group =
    ANY(%(groups)b) OR NOT EXISTS (SELECT 1 FROM others AS x WHERE x.grp = o.dest_group))))
    ORDER BY o.available_at, o.id LIMIT %(limit)s FOR UPDATE OF o SKIP LOCKED) UPDATE outbox
    AS o SET state = 'dispatching', claim_token = %(token)s, claimed_by = %(worker)s,
    claimed_at = %(now)s, updated_at = %(now)s FROM due WHERE o.id = due.id RETURNING o.id,
    o.address, o.kind, o.task_id, o.version, o.promise, o.created_at, o.state, o.attempts,
    o.available_at, o.claim_token, o.claimed_by, o.claimed_at, o.last_code, o.updated_at

-- FOR UPDATE: a concurrent reaper or settlement must not slip between the check and
-- the update (READ COMMITTED re-checks the WHERE on the row it finally locks).
-- name: held
SELECT key, attempts FROM outbox WHERE id = %s AND state = 'dispatching' AND claim_token =
    %s FOR UPDATE

-- name: in_state
SELECT key, attempts FROM outbox WHERE id = %s AND state = %s FOR UPDATE

-- name: has_pending
SELECT 1 FROM outbox WHERE key = %s AND state = 'pending'

-- name: finish
UPDATE outbox SET state = %s, attempts = %s, claim_token = NULL, last_code = %s, updated_at
    = %s WHERE id = %s

-- held then finish for many distinct rows at once; a failure counts an attempt.
-- Each row is found by its id (the primary key), and the claim's token alone says it
-- is still held: a token is set only on a row moved to dispatching, and every move out
-- of dispatching clears it.  A condition on state would let the planner walk
-- outbox_state_available's dispatching entries instead, which pile up dead while a
-- snapshot holds the horizon back (every delivered row passed through dispatching).
-- name: finish_many
UPDATE outbox AS o SET state = v.state, attempts = o.attempts + v.failed, claim_token =
    NULL, last_code = v.code, updated_at = v.now::numeric FROM unnest(%b::bigint[],
    %b::text[], %b::text[], %b::int[], %b::text[], %b::text[]) AS v(id, token, state,
    failed, code, now) WHERE o.id = v.id AND o.claim_token = v.token RETURNING o.id

-- If a request inserts a newer pending row of the key between has_pending and this
-- update, the partial unique index refuses it (23505) and the transaction re-runs,
-- finding that row this time.
-- name: requeue
UPDATE outbox SET state = 'pending', attempts = %s, claim_token = NULL, last_code = %s,
    updated_at = %s, available_at = %s WHERE id = %s

-- By outbox_unknown (rows of that state only): outbox_pkey in id order would pass
-- every row of the table to find none.
-- name: unknown_rows
SELECT id, address, kind, task_id, version, promise, created_at, state, attempts,
    available_at, claim_token, claimed_by, claimed_at, last_code, updated_at FROM outbox
    WHERE state = 'outcome_unknown' ORDER BY id LIMIT %s

-- The reaper, by outbox_claimed (every claim stamps claimed_at): a pass from the bottom
-- stops at the cutoff; the usual pass (release_expired_since) starts from the last
-- pass's cutoff, so it walks the entries of the claims taken since, not of every claim
-- before (a held horizon keeps a dead one for each row delivered).
-- name: release_expired
UPDATE outbox SET state = 'outcome_unknown', claim_token = NULL, last_code = %s, updated_at
    = %s WHERE state = 'dispatching' AND claimed_at < %s

-- name: release_expired_since
UPDATE outbox SET state = 'outcome_unknown', claim_token = NULL, last_code = %s, updated_at
    = %s WHERE state = 'dispatching' AND claimed_at >= %s AND claimed_at < %s

-- A row is completed after its claim, which it was due by (available_at <= claimed_at
-- <= updated_at): so a row the purge looks for is also older by available_at, and the
-- walk of outbox_state_available stops at the cutoff instead of passing every
-- completed entry, dead ones included.
-- name: purge_completed
DELETE FROM outbox WHERE state = 'completed' AND updated_at < %s AND available_at < %s

-- name: next_due
SELECT min(available_at) FROM outbox WHERE state = 'pending'

-- A pending row held back (the server's bounce backoff, a requeue) due as written,
-- i.e. at once: a worker connected.
-- Whether a newer execute was written for a task (store/outbox.py, retry_failed).
-- name: newer_execute
SELECT 1 FROM outbox WHERE task_id = %s AND id > %s LIMIT 1

-- name: expedite
UPDATE outbox SET available_at = created_at WHERE key = %s AND state = 'pending' AND
    available_at > created_at

-- At COMMIT a notifying transaction takes one database-wide lock, held by other
-- notifying commits through their flush: waiting for it is no deadlock risk, so the
-- short lock_timeout is lifted for it.  Payload: "{node} {messages} {deadline|-}".
-- name: notify
SELECT set_config('lock_timeout', '0', true), pg_notify('troth', %s)

-- DELETE under an exclusive lock rather than TRUNCATE: the same for a debug reset,
-- ~2 ms instead of ~45 ms (TRUNCATE makes new files for every table and index).
-- name: reset
LOCK TABLE promises, tasks, schedules, outbox IN ACCESS EXCLUSIVE MODE; DELETE FROM outbox;
    DELETE FROM tasks; DELETE FROM promises; DELETE FROM schedules; DELETE FROM flow_held;
    DELETE FROM flow_slots; DELETE FROM flow_limits; ALTER TABLE outbox ALTER COLUMN id
    RESTART

-- A batch's prefetch: ORDER BY before FOR UPDATE, so rows lock in sorted id order.
-- name: prelock_promises
SELECT id, state, param, value, tags, timeout_at, created_at, settled_at, callbacks,
    listeners FROM promises WHERE id = ANY(%b) ORDER BY id FOR UPDATE

-- name: prelock_tasks
SELECT id, state, version, ttl, pid, expires_at, retry_at, resumes FROM tasks WHERE id =
    ANY(%b) ORDER BY id FOR UPDATE

-- name: prelock_schedules
SELECT id FROM schedules WHERE id = ANY(%b) ORDER BY id FOR UPDATE

-- Membership of several nodes (server/delivery/cluster.py), on the database's clock.
-- name: node_register
INSERT INTO nodes (node, url, started_at, seen_at, release, schema_version)
    VALUES (%s, %s, extract(epoch FROM clock_timestamp()) * 1000,
            extract(epoch FROM clock_timestamp()) * 1000, %s, %s)
    ON CONFLICT (node) DO UPDATE SET url = excluded.url, seen_at = excluded.seen_at,
        release = excluded.release, schema_version = excluded.schema_version

-- name: node_heartbeat
UPDATE nodes SET seen_at = extract(epoch FROM clock_timestamp()) * 1000 WHERE node = %s

-- name: node_leave
DELETE FROM nodes WHERE node = %s

-- name: connections_forget
DELETE FROM connections WHERE node = %s

-- A connection also marks its group seen (worker_groups: "last seen" for explain).
-- name: connection_add
WITH seen AS (
    INSERT INTO worker_groups (grp, seen_at)
        VALUES (%(grp)s, extract(epoch FROM clock_timestamp()) * 1000)
        ON CONFLICT (grp) DO UPDATE SET seen_at = excluded.seen_at
)
INSERT INTO connections (node, grp, pid, since)
    VALUES (%(node)s, %(grp)s, %(pid)s, extract(epoch FROM clock_timestamp()) * 1000)
    ON CONFLICT DO NOTHING

-- name: connection_drop
WITH seen AS (
    INSERT INTO worker_groups (grp, seen_at)
        VALUES (%(grp)s, extract(epoch FROM clock_timestamp()) * 1000)
        ON CONFLICT (grp) DO UPDATE SET seen_at = excluded.seen_at
)
DELETE FROM connections WHERE node = %(node)s AND grp = %(grp)s AND pid = %(pid)s

-- A node published streams (`pairs`, "group/id"): the messages for them that no node
-- could deliver are offered again (server/delivery/cluster.py, "No message is stranded").
-- Those backed off for want of a connection come due at once; of those that
-- exhausted their attempts (only a missing connection fails a poll:// send that way)
-- since %(since)s, the newest of each key comes back as pending — unless a pending
-- row of that key holds its place, or (an execute) its task has a newer execute,
-- sent or not (outbox_task finds it): the newer message is the one to send.
-- name: connections_revive
WITH held_back AS (UPDATE outbox SET available_at = created_at WHERE state = 'pending'
    AND available_at > %(now)s::numeric AND last_code = %(no_connection)s AND dest_group
    || '/' || dest_id = ANY(%(pairs)s) RETURNING id), newest AS (SELECT DISTINCT ON
    (f.key) f.id FROM outbox AS f WHERE f.state = 'failed' AND f.available_at >=
    %(since)s::numeric AND f.last_code = %(exhausted)s AND f.dest_group || '/' ||
    f.dest_id = ANY(%(pairs)s) AND NOT EXISTS (SELECT 1 FROM outbox AS p WHERE p.key =
    f.key AND p.state = 'pending') AND NOT EXISTS (SELECT 1 FROM outbox AS n WHERE
    n.task_id = f.task_id AND n.id > f.id) ORDER BY f.key, f.id DESC), revived AS (UPDATE outbox
    AS o SET state = 'pending', attempts = 0, available_at = o.created_at, last_code =
    NULL, updated_at = %(now)s::numeric FROM newest WHERE o.id = newest.id RETURNING o.id)
    SELECT (SELECT count(*) FROM held_back), (SELECT count(*) FROM revived)

-- Nodes whose heartbeat is older than %s ms, locked: one live node reaps each.
-- name: nodes_dead
SELECT node FROM nodes WHERE seen_at < extract(epoch FROM clock_timestamp()) * 1000 - %s
    ORDER BY node FOR UPDATE

-- A dead node's claims may have been sent: their outcome is unknown (reconciled).
-- name: claims_of_nodes_unknown
UPDATE outbox SET state = 'outcome_unknown', claim_token = NULL, last_code = %s,
    updated_at = %s WHERE state = 'dispatching' AND claimed_by = ANY(%s)

-- The groups a dead node held connections of were last seen at its last heartbeat.
-- name: groups_of_nodes_seen
INSERT INTO worker_groups (grp, seen_at)
    SELECT c.grp, max(n.seen_at) FROM connections c JOIN nodes n ON n.node = c.node
        WHERE c.node = ANY(%s) GROUP BY c.grp
    ON CONFLICT (grp) DO UPDATE SET seen_at = greatest(worker_groups.seen_at, excluded.seen_at)

-- name: nodes_delete
DELETE FROM nodes WHERE node = ANY(%s)

-- What the operator API shows of the cluster (server/delivery/cluster.py, ops/).  Nodes and
-- their connections, with the database's clock for "now" (ms).
-- name: ops_nodes
SELECT node, url, started_at, seen_at, extract(epoch FROM clock_timestamp()) * 1000,
    release, schema_version FROM nodes ORDER BY node

-- name: ops_connections
SELECT node, grp, pid, since FROM connections ORDER BY grp, pid, node

-- name: ops_groups
SELECT grp, seen_at FROM worker_groups ORDER BY grp

-- What holds this database's xmin horizon back (the troth_postgres_horizon_* gauges):
-- the seconds since the oldest transaction of another application that holds a
-- snapshot or an xid began (troth's own sessions hold theirs for one batch); the most
-- transactions that any holder lags (sessions, prepared transactions, replication
-- slots); the hot tables' dead tuples.  Other roles' sessions show only to a
-- superuser or a member of pg_read_all_stats.
-- name: ops_horizon
SELECT COALESCE((SELECT extract(epoch FROM clock_timestamp() - min(xact_start)) FROM
    pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND
    (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND left(application_name, 5)
    <> 'troth'), 0), COALESCE(GREATEST((SELECT max(GREATEST(age(backend_xmin),
    age(backend_xid))) FROM pg_stat_activity WHERE datname = current_database()), (SELECT
    max(age(transaction)) FROM pg_prepared_xacts WHERE database = current_database()),
    (SELECT max(age(xmin)) FROM pg_replication_slots)), 0), (SELECT
    json_object_agg(relname, n_dead_tup) FROM pg_stat_user_tables WHERE schemaname =
    current_schema() AND relname IN ('outbox', 'tasks', 'promises'))

-- The trace context a promise was created in (tracing on: server/tracing.py).
-- name: get_trace
SELECT trace FROM promises WHERE id = %s

-- Kept from the first traced request that wrote each promise: a later one (a
-- settle, a re-create that deduplicates) leaves it.
-- name: set_traces
UPDATE promises SET trace = t.trace FROM unnest(%b::text[], %b::text[]) AS t (id, trace)
    WHERE promises.id = t.id AND promises.trace IS NULL

-- Flow control (troth/flow): read and written only while some group has a limit.  A
-- job that counts a group's slots or admits its held tasks first locks the group's
-- limit row (flow_lock): two nodes' admissions to one group take turns, so the count
-- each reads is exact.
-- name: flow_limits
SELECT grp, concurrency, rate, burst, per_key FROM flow_limits ORDER BY grp

-- The lock, with what it guards: the token bucket, the turn, the slots in use.
-- name: flow_lock
SELECT tat, turn, (SELECT count(*) FROM flow_slots s WHERE s.grp = l.grp)
FROM flow_limits l WHERE l.grp = %s FOR UPDATE

-- A task's place in its group's queue (NULLs: not queued), and the last turn a new
-- task of its key queues behind: the group's, or the key's last queued task's.
-- name: flow_place
SELECT greatest((SELECT turn FROM flow_limits WHERE grp = %s),
                (SELECT max(turn) FROM flow_held WHERE grp = %s AND fkey = %s)),
       h.task_id, h.grp, h.address, h.priority, h.created_at, h.fkey, h.turn
FROM (SELECT 1) AS one LEFT JOIN flow_held h ON h.task_id = %s

-- name: flow_slot
SELECT grp FROM flow_slots WHERE task_id = %s

-- name: flow_in_use
SELECT count(*) FROM flow_slots WHERE grp = %s

-- name: flow_slots_of
SELECT task_id FROM flow_slots WHERE grp = %s ORDER BY task_id

-- name: flow_held
SELECT task_id, grp, address, priority, created_at, fkey, turn FROM flow_held
WHERE grp = %s ORDER BY priority DESC, turn, created_at, task_id LIMIT %s OFFSET %s

-- name: flow_queued
SELECT task_id, grp, address, priority, created_at, fkey, turn FROM flow_held
WHERE task_id = %s

-- The last turn of a key's queued tasks (flow_held_key), and the group's: the turn of
-- the last task let through.
-- name: flow_key_turn
SELECT max(turn) FROM flow_held WHERE grp = %s AND fkey = %s

-- name: flow_turn
SELECT turn FROM flow_limits WHERE grp = %s

-- name: flow_put_turn
UPDATE flow_limits SET turn = %s WHERE grp = %s

-- name: flow_key_in_use
SELECT count(*) FROM flow_slots WHERE grp = %s AND fkey = %s

-- name: flow_held_count
SELECT count(*) FROM flow_held WHERE grp = %s

-- name: flow_put_slot
INSERT INTO flow_slots (task_id, grp, fkey) VALUES (%s, %s, %s)
ON CONFLICT (task_id) DO UPDATE SET grp = excluded.grp, fkey = excluded.fkey

-- name: flow_delete_slot
DELETE FROM flow_slots WHERE task_id = %s

-- name: flow_put_held
INSERT INTO flow_held (task_id, grp, address, priority, created_at, fkey, turn)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (task_id) DO UPDATE SET grp = excluded.grp, address = excluded.address,
    priority = excluded.priority, created_at = excluded.created_at, fkey = excluded.fkey,
    turn = excluded.turn

-- name: flow_delete_held
DELETE FROM flow_held WHERE task_id = %s

-- name: flow_put_limit
INSERT INTO flow_limits (grp, concurrency, rate, burst, per_key, updated_at)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (grp) DO UPDATE SET concurrency = excluded.concurrency,
    rate = excluded.rate, burst = excluded.burst, per_key = excluded.per_key,
    updated_at = excluded.updated_at

-- A rate limit's token bucket: the theoretical arrival time of the next start (ms).
-- name: flow_tat
SELECT tat FROM flow_limits WHERE grp = %s

-- name: flow_put_tat
UPDATE flow_limits SET tat = %s WHERE grp = %s

-- name: flow_delete_limit
DELETE FROM flow_limits WHERE grp = %s

-- name: flow_delete_group_slots
DELETE FROM flow_slots WHERE grp = %s

-- name: flow_withdraw
DELETE FROM outbox WHERE key = %s AND state = 'pending'
