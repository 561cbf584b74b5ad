-- Version 12: outbox_claimed, the claims in the order they were taken: the reaper
-- reads only the claims taken since its last pass.  By outbox_state_available it
-- walked every dispatching entry due before its cutoff, and while a snapshot holds the
-- horizon back each delivered row leaves one (dead) there: a walk that grew for as
-- long as the horizon was held.  Expand-only: an index an older release does not know
-- of.
CREATE INDEX IF NOT EXISTS outbox_claimed ON outbox (claimed_at) WHERE state = 'dispatching';
