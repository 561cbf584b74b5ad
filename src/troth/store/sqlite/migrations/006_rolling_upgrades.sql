-- Version 6: the rule of rolling upgrades (docs/operations.md, "Upgrades").
--
-- Every migration is expand-only: it adds tables, nullable columns, indexes and
-- triggers, and never drops, renames or redefines what the previous release reads or
-- writes.  A SQLite file has one troth process at a time, so nothing older writes it
-- after this migration (that process refuses a newer schema when it opens the file);
-- unlike PostgreSQL's version 6 there is no trigger to keep columns derived for an
-- older writer.  What this version does is repair: a promise whose origin column was
-- left NULL although its tags carry resonate:origin (a row written by a troth older
-- than version 3 while a newer one had already migrated the file) gets it now, so
-- searches by origin and retention's index of settled roots see it.
UPDATE promises SET origin = json_extract(tags, '$."resonate:origin"')
    WHERE origin IS NULL AND instr(tags, 'resonate:origin') > 0;
