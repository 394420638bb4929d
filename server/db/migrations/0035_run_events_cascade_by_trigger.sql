-- The event log's foreign key to `runs` goes; a trigger deletes a deleted run's events instead
-- (docs/decisions/2002). With the key, each day partition carried its own copy of it once
-- detached, and dropping that partition took an ACCESS EXCLUSIVE lock on `runs`: it stalled
-- every reader of runs, and deadlocked with any transaction that had read `runs` and then
-- wrote it. Events cannot point at a missing run without the key: both append paths insert
-- only the rows of a run whose row their own conditional update just moved.
DO $$
DECLARE
    fk text;
BEGIN
    FOR fk IN
        SELECT conname FROM pg_constraint
        WHERE conrelid = 'run_events'::regclass AND contype = 'f'
          AND confrelid = 'runs'::regclass
    LOOP
        EXECUTE format('ALTER TABLE run_events DROP CONSTRAINT %I', fk);
    END LOOP;
END $$;

-- Events go with their run, as `ON DELETE CASCADE` did: for a run deleted directly, or through
-- its conversation's cascade.
CREATE FUNCTION agentrt_delete_run_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM run_events e USING gone WHERE e.run_id = gone.id;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_delete_events AFTER DELETE ON runs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION agentrt_delete_run_events();
