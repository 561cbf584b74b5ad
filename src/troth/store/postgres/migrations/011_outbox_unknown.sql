-- Version 11: outbox_unknown, the rows whose outcome is unknown, in id order: what the
-- reconciler reads every second.  Without it, the read walks outbox_pkey from the
-- start and passes every row of the table (and, while a snapshot holds the horizon
-- back, every dead version) to find the few it wants.  Expand-only: an index an older
-- release does not know of.
CREATE INDEX IF NOT EXISTS outbox_unknown ON outbox (id) WHERE state = 'outcome_unknown';
