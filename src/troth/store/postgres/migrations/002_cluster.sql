-- Version 2: several troth nodes on one database (see server/cluster.py).
--
-- * nodes: every running troth process, with a heartbeat (seen_at, from the
--   database's clock, so node clocks need not agree).  A node whose heartbeat is
--   older than its peers' node_timeout is dead: its SSE connections no longer count
--   and its outbox claims are reaped at once.
-- * connections: which (group, id) each node holds an SSE connection for.  It is
--   what decides which node claims a poll:// message (the one that can deliver it).
-- * outbox.dest_*: the parsed poll:// address of a row (NULL for http(s) and for
--   unparseable addresses, which any node may claim), so that a claim can filter on
--   it without parsing text in SQL.  New rows get them from the server's own parser
--   (protocol/address.py); the UPDATE below fills in rows written by version 1.

CREATE TABLE nodes (
    node TEXT COLLATE "C" PRIMARY KEY,
    url TEXT NOT NULL,
    started_at NUMERIC NOT NULL,
    seen_at NUMERIC NOT NULL
);

CREATE TABLE connections (
    node TEXT COLLATE "C" NOT NULL REFERENCES nodes (node) ON DELETE CASCADE,
    grp TEXT COLLATE "C" NOT NULL,
    pid TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (node, grp, pid)
);

CREATE INDEX connections_destination ON connections (grp, pid);

ALTER TABLE outbox
    ADD COLUMN dest_cast TEXT,
    ADD COLUMN dest_group TEXT COLLATE "C",
    ADD COLUMN dest_id TEXT COLLATE "C";

UPDATE outbox SET
    dest_cast = m[1],
    dest_group = lower(m[2]),
    dest_id = nullif(m[3], '')
FROM (
    SELECT id AS row_id, regexp_match(address, '^poll://(uni|any)@([^/]+)(?:/(.*))?$') AS m
    FROM outbox WHERE address LIKE 'poll://%'
) AS parsed
WHERE outbox.id = parsed.row_id AND m IS NOT NULL AND (m[1] = 'any' OR coalesce(m[3], '') <> '');
