-- Version 5: retention finds settled workflows by their root, oldest first.
--
-- A workflow is its root promise and every promise whose resonate:origin names it;
-- a root is a promise without an origin or whose origin is itself.  Only settled
-- roots are entries (one per workflow, not one per step), in the order retention
-- reads them: when they settled.
CREATE INDEX promises_settled_roots ON promises (settled_at, id)
    WHERE state <> 'pending' AND (origin IS NULL OR origin = id);
