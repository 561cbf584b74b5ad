-- Version 11: outbox_unknown, the rows whose outcome is unknown, in id order: what the
-- reconciler reads every second, without passing the rest of the outbox (the same
-- index as PostgreSQL's, where it matters most while the horizon is held).
-- Expand-only: an index an older release does not know of.
CREATE INDEX IF NOT EXISTS outbox_unknown ON outbox (id) WHERE state = 'outcome_unknown';
