-- Version 7: the trace context a promise was created in (docs/operations.md,
-- "Tracing").  With tracing on, a request that creates a promise keeps the W3C
-- traceparent of its own span here, so that what follows from the promise — its
-- task's execute, the worker's acquire, fence and fulfil, its children — joins the
-- same trace, on whichever node serves it.  A column the SDKs never see (not a tag),
-- NULL when tracing was off.  Expand-only (docs/operations.md, "Upgrades"): a node
-- of an older release neither reads nor writes it, and adding a nullable column
-- without a default rewrites no rows.
ALTER TABLE promises ADD COLUMN trace TEXT;
