-- The run row's updates while a run goes on become HOT (docs/decisions/1983). An update is
-- HOT, with no new entry in any of the table's indexes, only if no column an index names (as
-- a key or in its predicate) changes. The partial indexes of the queue and the leases named
-- `status` and `lease_expires_at`, so every status flip (running and waiting_tool around each
-- tool call), the claim and every lease renewal wrote an entry in each index of `runs`.
--
-- `phase` is what those indexes need of the status: queued, active (running or waiting_tool),
-- or neither. Flips within a phase leave it unchanged. No index names `lease_expires_at` any
-- more: the lease sweep reads the runs whose lease a worker holds (`runs_held`, as many as the
-- workers' slots; a parent waiting for its children is active but holds none) and filters
-- their expiry. Adding a stored column rewrites `runs` once, under its lock.
ALTER TABLE runs ADD COLUMN phase text GENERATED ALWAYS AS (
    CASE WHEN status = 'queued' THEN 'queued'
         WHEN status IN ('running', 'waiting_tool') THEN 'active' END) STORED;

DROP INDEX runs_queued;
DROP INDEX runs_leased;
DROP INDEX runs_active_by_user;
DROP INDEX runs_queued_by_user;
CREATE INDEX runs_queued ON runs (created_at) WHERE phase = 'queued';
CREATE INDEX runs_queued_by_user ON runs (tenant_id, user_id, created_at) WHERE phase = 'queued';
CREATE INDEX runs_active_by_user ON runs (tenant_id, user_id) WHERE phase = 'active';
CREATE INDEX runs_held ON runs (lease_owner) WHERE phase = 'active' AND lease_owner IS NOT NULL;
