-- Version 8: flow control (docs/operations.md, "Flow control").  A limit per worker
-- group; the tasks that hold one of its slots (acquired, or their execute let
-- through and not yet acquired); the tasks queued for a slot, in the order they are
-- admitted (higher troth:priority first, then first created).  Expand-only: new
-- tables that an older release neither reads nor writes.
CREATE TABLE flow_limits (
    grp         TEXT PRIMARY KEY,
    concurrency INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);
CREATE TABLE flow_slots (
    task_id TEXT PRIMARY KEY,
    grp     TEXT NOT NULL
);
CREATE INDEX flow_slots_grp ON flow_slots (grp);
CREATE TABLE flow_held (
    task_id    TEXT PRIMARY KEY,
    grp        TEXT NOT NULL,
    address    TEXT NOT NULL,
    priority   INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX flow_held_order ON flow_held (grp, priority DESC, created_at, task_id);
