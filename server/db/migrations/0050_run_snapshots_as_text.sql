-- A run's stored snapshot as the JSON text the appender sent (docs/decisions/2049), as a
-- manifest's (0045) and a span set's (0049) are. `jsonb` held a snapshot in about 1.3 times
-- the bytes of its compact text, and the only readers that parse it in SQL are the sweep of
-- waiting parents; the others hand it to the server, which parses either form alike. New
-- rows, and rows written again, keep `snapshot_text`; rows stored before keep `snapshot`
-- until then. No row is rewritten: the column is added empty, `snapshot` loses its NOT NULL.
ALTER TABLE run_snapshots
    ADD COLUMN snapshot_text json,
    ALTER COLUMN snapshot DROP NOT NULL;
-- One of the two, never both or neither. NOT VALID: no scan of the rows stored before.
ALTER TABLE run_snapshots ADD CONSTRAINT run_snapshots_one_form
    CHECK ((snapshot IS NULL) <> (snapshot_text IS NULL)) NOT VALID;
