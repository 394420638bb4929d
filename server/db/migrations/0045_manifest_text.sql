-- A model call's manifest as the JSON text the append wrote (docs/decisions/2041). `jsonb`
-- held a manifest in about 1.34 times the bytes of its compact text (each key and value's
-- header, numbers as `numeric`), and every read that returns a manifest turns it into text
-- again; the table's row is the largest row agentrt writes per model call beside the
-- checkpoints'. New rows keep the text in `manifest_text`, checked as JSON when stored and
-- parsed when read; rows stored before keep their `jsonb`. Readers take
-- `COALESCE(manifest, manifest_text::jsonb)` (server/events/manifests.py `STORED`).
-- No row is rewritten: the column is added empty, and `manifest` loses its NOT NULL.
ALTER TABLE context_manifests
    ADD COLUMN manifest_text json,
    ALTER COLUMN manifest DROP NOT NULL;
-- One of the two, never both or neither. NOT VALID: the rows before hold `manifest`, and the
-- check needs no scan of them under the table's lock.
ALTER TABLE context_manifests ADD CONSTRAINT context_manifests_one_form
    CHECK ((manifest IS NULL) <> (manifest_text IS NULL)) NOT VALID;
