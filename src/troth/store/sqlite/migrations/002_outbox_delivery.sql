-- Version 2: the outbox delivery lifecycle.
--
-- A row is now pending, then claimed by a dispatcher, then finished; a new message
-- for the same key must be able to supersede the *pending* row while an older row of
-- that key is still in flight.  So UNIQUE(key) becomes a partial unique index over
-- pending rows.  SQLite cannot drop a UNIQUE constraint, hence the rebuild (the
-- twelve-step procedure of https://www.sqlite.org/lang_altertable.html; there are no
-- foreign keys, views or triggers on outbox to carry over).

CREATE TABLE outbox_new (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    address TEXT NOT NULL,
    kind TEXT NOT NULL,
    task_id TEXT,
    version INTEGER,
    promise TEXT,
    created_at INTEGER NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    available_at INTEGER NOT NULL DEFAULT 0,
    claim_token TEXT,
    claimed_by TEXT,
    claimed_at INTEGER,
    last_code TEXT,
    updated_at INTEGER NOT NULL DEFAULT 0
);

-- Every version-1 row was undelivered: it becomes pending, available at once.
INSERT INTO outbox_new (id, key, address, kind, task_id, version, promise, created_at,
                        state, attempts, available_at, updated_at)
SELECT id, key, address, kind, task_id, version, promise, created_at,
       'pending', 0, created_at, created_at
FROM outbox;

-- Keep the AUTOINCREMENT high-water mark: ids of rows already superseded (deleted)
-- must not be handed out again.
DELETE FROM sqlite_sequence WHERE name = 'outbox_new';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'outbox_new', seq FROM sqlite_sequence WHERE name = 'outbox';

DROP TABLE outbox;
ALTER TABLE outbox_new RENAME TO outbox;

-- At most one pending row per key (the keyed upsert of set_message).
CREATE UNIQUE INDEX outbox_pending_key ON outbox (key) WHERE state = 'pending';

-- The dispatcher's queue: rows of a state that are available by now.
CREATE INDEX outbox_state_available ON outbox (state, available_at);
