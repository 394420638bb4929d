-- A model call's manifest is stored once, in `context_manifests` (docs/decisions/2039). The
-- append writes the row itself, in its statement or transaction, and the log keeps a stub of
-- the `context.built` event that reads of the log put the manifest back into; the trigger
-- that copied each event's data into the table goes.
--
-- A row is keyed by its event, no longer by (run, step, attempt): a stub finds its own
-- manifest, and a second `context.built` of the same step and attempt (a step run again)
-- no longer rewrites the first one's. Readers of a step's manifest take the latest.
-- Events stored whole before this migration keep their data. The new key's index is built
-- under an exclusive lock on the table (the table has one row per model call).
DROP TRIGGER run_events_context_manifest ON run_events;
DROP FUNCTION agentrt_store_context_manifest();
ALTER TABLE context_manifests DROP CONSTRAINT context_manifests_pkey;
ALTER TABLE context_manifests ADD PRIMARY KEY (run_id, event_seq);
