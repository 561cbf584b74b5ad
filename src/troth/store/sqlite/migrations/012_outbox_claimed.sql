-- Version 12: outbox_claimed, the claims in the order they were taken, for the
-- reaper's reads of the claims taken since its last pass (the same index as
-- PostgreSQL's, where it matters most while the horizon is held).
-- Expand-only: an index an older release does not know of.
CREATE INDEX IF NOT EXISTS outbox_claimed ON outbox (claimed_at) WHERE state = 'dispatching';
