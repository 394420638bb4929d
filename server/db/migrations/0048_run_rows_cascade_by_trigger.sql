-- A run's manifests, model calls and snapshot lose their foreign keys to `runs`; the trigger
-- that deletes a deleted run's events deletes them too, as `ON DELETE CASCADE` did
-- (docs/decisions/2047, as 2002 did for the event log). Each insert's key check locked the
-- run's row (`FOR KEY SHARE`) in the append's transaction, right after the append had moved
-- the row: a lock record in the WAL for a row the transaction already held, and a query per
-- inserted row. These rows cannot point at a missing run without the keys: every one of
-- them is written by an append, in the transaction whose conditional update just moved the
-- run's row, and only if it moved it (server/events/store.py, server/events/calls.py, the
-- ledger's store hook, the claim's snapshot).
DO $$
DECLARE
    fk record;
BEGIN
    FOR fk IN
        SELECT conrelid::regclass AS tab, conname FROM pg_constraint
        WHERE conrelid IN ('context_manifests'::regclass, 'model_calls'::regclass,
                           'run_snapshots'::regclass)
          AND contype = 'f' AND confrelid = 'runs'::regclass
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', fk.tab, fk.conname);
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION agentrt_delete_run_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM run_events e USING gone WHERE e.run_id = gone.id;
    DELETE FROM context_manifests m USING gone WHERE m.run_id = gone.id;
    DELETE FROM model_calls c USING gone WHERE c.run_id = gone.id;
    DELETE FROM run_snapshots s USING gone WHERE s.run_id = gone.id;
    RETURN NULL;
END $$;
