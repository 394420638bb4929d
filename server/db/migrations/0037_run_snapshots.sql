-- The run's snapshot leaves the run row (docs/decisions/2010). In the row, every update of
-- the run (each append, the claim, each lease renewal) wrote the whole snapshot to the WAL
-- again, changed or not: about 14 KiB of WAL per short run. Here it is written only when the
-- run is not held by a worker after the append (created, queued again, waiting for a person,
-- paused, ended), and every `LAG_MAX` events while one holds it; `seq` is the last event it
-- folds. Readers fold the events after `seq` from the log (server/events/log.py).
CREATE TABLE run_snapshots (
    run_id    text PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    seq       bigint NOT NULL,
    snapshot  jsonb NOT NULL
);

INSERT INTO run_snapshots (run_id, seq, snapshot)
SELECT id, last_event_seq, snapshot FROM runs WHERE snapshot <> '{}'::jsonb;

ALTER TABLE runs DROP COLUMN snapshot;
