-- The checkpoint fence holds the run's row in key-share mode instead of share mode.
-- A takeover changes the lease generation only under `FOR UPDATE` (the claim and the
-- recovery), which still waits for (or fails) a fenced write in flight; the worker's own
-- event appends (`UPDATE runs`, a no-key update) no longer wait for its checkpoint writes,
-- nor these for them.

CREATE OR REPLACE FUNCTION agentrt_fence(run text, generation bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM runs WHERE id = run AND lease_generation = generation FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run %: checkpoint refused, lease generation % superseded', run, generation
            USING ERRCODE = 'AR001';
    END IF;
END
$$;
