-- The checkpoint fence (server/db/checkpoint.py) as one statement, so that a fenced checkpoint
-- write can go to the server in a single pipelined round trip: hold the run's row in share
-- mode until the transaction ends, and fail it unless the writer's lease generation is current.

CREATE FUNCTION agentrt_fence(run text, generation bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM runs WHERE id = run AND lease_generation = generation FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run %: checkpoint refused, lease generation % superseded', run, generation
            USING ERRCODE = 'AR001';
    END IF;
END
$$;
