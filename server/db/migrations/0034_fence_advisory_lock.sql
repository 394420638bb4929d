-- The checkpoint fence takes a shared advisory lock on the run instead of a row lock.
-- A row lock, even in key-share mode, writes a WAL record each time, and a multixact whenever
-- the worker's own event append updates the row at the same moment; an advisory lock lives
-- only in shared memory. The claim and the recovery of expired leases take the same lock
-- exclusively, with `pg_try_advisory_xact_lock`, before they move the lease generation on:
-- a fenced write in flight commits first (the run is skipped until it has), and a write that
-- starts after the takeover waits for it to commit, then finds the new generation. Keys are
-- (7301, hashtext(run id)): a class of their own among advisory locks.

CREATE FUNCTION agentrt_fence_key(run text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT hashtext(run) $$;

CREATE OR REPLACE FUNCTION agentrt_fence(run text, generation bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(7301, agentrt_fence_key(run));
    -- A statement of its own, so that its snapshot is taken after the lock was granted.
    PERFORM 1 FROM runs WHERE id = run AND lease_generation = generation;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run %: checkpoint refused, lease generation % superseded', run, generation
            USING ERRCODE = 'AR001';
    END IF;
END
$$;
