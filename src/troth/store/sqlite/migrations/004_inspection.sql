-- Version 4: what `troth explain` and the operator API read.
--
-- A task's delivery history (how many executes were written for it, what became of
-- each) is one range read on its outbox rows.  Only executes carry a task id.
CREATE INDEX outbox_task ON outbox (task_id, id) WHERE task_id IS NOT NULL;

-- What is pending, listed in id order without reading the settled (most) rows: the
-- search by state = pending (`troth promises search --state pending`, /ops/promises).
CREATE INDEX promises_pending ON promises (id) WHERE state = 'pending';
