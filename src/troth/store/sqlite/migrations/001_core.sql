-- Version 1: the core tables.
--
-- Each stored object is one row keyed by its id; the JSON columns (param, value,
-- tags, callbacks, listeners, resumes, promise) hold msgspec encodings of the
-- protocol records and are decoded back into the same frozen Structs.
--
-- Columns that only exist to be searched (external, branch, undrained) are derived
-- from the object when it is written, so every timer and repair query is a range
-- scan on a small partial index instead of a walk over every row.
--
-- Integers that do not fit in 64 bits (the protocol's naturals are unbounded) are
-- stored as BLOBs by sqlite.py: a BLOB sorts after every INTEGER, so such a deadline
-- is never due, which is exactly what an astronomically far deadline means.

CREATE TABLE promises (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    param TEXT NOT NULL,
    value TEXT NOT NULL,
    tags TEXT NOT NULL,
    timeout_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    settled_at INTEGER,
    callbacks TEXT NOT NULL,
    listeners TEXT NOT NULL,
    external INTEGER NOT NULL,
    branch TEXT,
    undrained INTEGER NOT NULL
);

-- Timeouts the timer must fire (r1): only pending external promises carry one.
CREATE INDEX promises_timeout ON promises (timeout_at, id)
    WHERE state = 'pending' AND external = 1;

-- preload: a branch's promises in id order.
CREATE INDEX promises_branch ON promises (branch, id) WHERE branch IS NOT NULL;

-- Repair (r3): settled promises whose callbacks or listeners are not yet drained.
CREATE INDEX promises_undrained ON promises (id) WHERE undrained = 1;

CREATE TABLE tasks (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    version INTEGER NOT NULL,
    ttl INTEGER,
    pid TEXT,
    expires_at INTEGER,
    retry_at INTEGER,
    resumes TEXT NOT NULL
);

-- A task has one live deadline: retry_at while pending, expires_at while acquired.
CREATE INDEX tasks_retry ON tasks (retry_at, id) WHERE state = 'pending';
CREATE INDEX tasks_expiry ON tasks (expires_at, id) WHERE state = 'acquired';

CREATE TABLE schedules (
    id TEXT PRIMARY KEY,
    cron TEXT NOT NULL,
    promise_id TEXT NOT NULL,
    promise_timeout INTEGER NOT NULL,
    promise_param TEXT NOT NULL,
    promise_tags TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    next_run_at INTEGER NOT NULL,
    last_run_at INTEGER
);

CREATE INDEX schedules_next_run ON schedules (next_run_at, id);

-- Messages written in the same transaction as the state change that caused them.
-- AUTOINCREMENT: a row id is never reused, so a delivery can be traced to one row.
CREATE TABLE outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE,
    address TEXT NOT NULL,
    kind TEXT NOT NULL,
    task_id TEXT,
    version INTEGER,
    promise TEXT,
    created_at INTEGER NOT NULL
);
