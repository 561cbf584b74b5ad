-- Version 6: rolling upgrades (docs/operations.md, "Upgrades").
--
-- Every migration is expand-only: it adds tables, nullable columns, defaults, indexes
-- and triggers, and never drops, renames or redefines what an older release reads
-- or writes, so a node of the previous release keeps working on the new schema.
-- What a newer schema derives from a row is derived by the database itself, so a
-- row an older node writes is never missing it:
--
-- * promises.origin (version 3) is the resonate:origin tag.  A node older than
--   version 3 writes promises without it; the trigger fills it in when a row is
--   inserted or its tags are written (a settle, which writes no tags, does not even
--   evaluate it; its WHEN clause is false at once for a row whose writer filled the
--   column, as every release since version 3 does).  Rows such a node wrote before
--   this version are repaired below.
-- * connections.since (version 4): an older node inserts connections without it;
--   the default is the database's clock, as this release writes it.
-- * nodes.release and nodes.schema_version: which troth each node runs (shown by
--   `troth workers` and the dashboard); NULL for a node of an older release.

CREATE FUNCTION troth_promise_origin() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.origin := NEW.tags::jsonb ->> 'resonate:origin';
    RETURN NEW;
END
$$;

CREATE TRIGGER promises_origin_derived
    BEFORE INSERT OR UPDATE OF tags ON promises
    FOR EACH ROW
    WHEN (NEW.origin IS NULL AND strpos(NEW.tags, 'resonate:origin') > 0)
    EXECUTE FUNCTION troth_promise_origin();

UPDATE promises SET origin = tags::jsonb ->> 'resonate:origin'
    WHERE origin IS NULL AND strpos(tags, 'resonate:origin') > 0;

ALTER TABLE connections
    ALTER COLUMN since SET DEFAULT extract(epoch FROM clock_timestamp()) * 1000;

ALTER TABLE nodes
    ADD COLUMN release TEXT,
    ADD COLUMN schema_version INTEGER;
