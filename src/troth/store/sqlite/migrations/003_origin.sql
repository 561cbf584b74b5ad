-- Version 3: a workflow's promises found by their origin through an index.
--
-- `troth tree` and searches by the resonate:origin tag read one workflow's promises;
-- a tag filter alone walks every promise (json_each per row).  origin is derived from
-- the tags on every write, like external, branch and undrained.
ALTER TABLE promises ADD COLUMN origin TEXT;

UPDATE promises SET origin = json_extract(tags, '$."resonate:origin"');

CREATE INDEX promises_origin ON promises (origin, id) WHERE origin IS NOT NULL;
