-- Version 3: a workflow's promises found by their origin through an index (as for
-- SQLite's version 3).  The UPDATE rewrites every stored promise once.
ALTER TABLE promises ADD COLUMN origin TEXT COLLATE "C";

UPDATE promises SET origin = tags::jsonb ->> 'resonate:origin';

CREATE INDEX promises_origin ON promises (origin, id) WHERE origin IS NOT NULL;
