-- Version 9: rate limits (docs/operations.md, "Flow control").  A limit may cap the
-- starts of its group per second (rate, a token bucket of burst tokens) besides, or
-- instead of, its concurrency; tat is the bucket (the theoretical arrival time of the
-- next start, ms).  Expand-only: columns an older release neither reads nor writes.
-- A limit with a rate only stores concurrency 2147483647, which an older node reads
-- as no cap.
ALTER TABLE flow_limits ADD COLUMN IF NOT EXISTS rate DOUBLE PRECISION;
ALTER TABLE flow_limits ADD COLUMN IF NOT EXISTS burst INTEGER;
ALTER TABLE flow_limits ADD COLUMN IF NOT EXISTS tat DOUBLE PRECISION NOT NULL DEFAULT 0;
