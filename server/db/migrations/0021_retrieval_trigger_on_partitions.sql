-- The evidence trigger of 0012 was on the event log before 0019 partitioned it (the old table
-- and its triggers went). Put it on the partitioned log, as 0019 does for the manifests.
CREATE OR REPLACE TRIGGER run_events_retrieval AFTER INSERT ON run_events
    FOR EACH ROW WHEN (NEW.type = 'retrieval.completed')
    EXECUTE FUNCTION agentrt_store_retrieval();
