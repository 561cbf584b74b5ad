-- Version 4: what `troth explain` and the operator API read.
--
-- * outbox_task: a task's delivery history (its execute rows) is one range read.
-- * connections.since: when a node started holding a (group, id) connection.
-- * worker_groups: when a group last had a connection anywhere (kept after the
--   last one closes, so that explain can say "no worker connected since ...").
CREATE INDEX outbox_task ON outbox (task_id, id) WHERE task_id IS NOT NULL;

ALTER TABLE connections ADD COLUMN since NUMERIC;

CREATE TABLE worker_groups (
    grp TEXT COLLATE "C" PRIMARY KEY,
    seen_at NUMERIC NOT NULL
);

-- What is pending, listed in id order without reading the settled (most) rows: the
-- search by state = pending (`troth promises search --state pending`, /ops/promises).
CREATE INDEX promises_pending ON promises (id) WHERE state = 'pending';
