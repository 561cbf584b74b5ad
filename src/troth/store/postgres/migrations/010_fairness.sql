-- Version 10: keys and fairness (docs/operations.md, "Flow control").  A task tagged
-- troth:key counts against its group's per_key limit (slots by key: flow_slots.fkey);
-- held tasks are let through round-robin across keys: each is queued with a turn
-- one past the last of its key's (and at least one past its group's, the turn of
-- the last task let through: flow_limits.turn), and the queue goes by priority,
-- then turn, then creation.  Expand-only: columns and indexes an older release
-- neither reads nor writes (its rows read as key '' and turn 0).
ALTER TABLE flow_limits ADD COLUMN IF NOT EXISTS per_key INTEGER;
ALTER TABLE flow_limits ADD COLUMN IF NOT EXISTS turn BIGINT NOT NULL DEFAULT 0;
ALTER TABLE flow_slots ADD COLUMN IF NOT EXISTS fkey TEXT NOT NULL DEFAULT '';
ALTER TABLE flow_held ADD COLUMN IF NOT EXISTS fkey TEXT NOT NULL DEFAULT '';
ALTER TABLE flow_held ADD COLUMN IF NOT EXISTS turn BIGINT NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS flow_held_turn ON flow_held (grp, priority DESC, turn, created_at, task_id);
CREATE INDEX IF NOT EXISTS flow_held_key ON flow_held (grp, fkey, turn);
CREATE INDEX IF NOT EXISTS flow_slots_key ON flow_slots (grp, fkey);
