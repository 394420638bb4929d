-- A span set's spans as the JSON text the writer sent (docs/decisions/2048), as a manifest's
-- are (0045). Postgres compresses a set's spans once its row passes 2 KiB, and the compact text
-- compresses to about nine tenths of what `jsonb` does (`jsonb` spells out each key and
-- value's header, and numbers as `numeric`): about 250 bytes of WAL per run. New rows keep
-- `spans_text`, checked as JSON when stored; rows stored before keep `spans`. No row is
-- rewritten: the column is added empty, and `spans` loses its NOT NULL.
ALTER TABLE trace_span_sets
    ADD COLUMN spans_text json,
    ALTER COLUMN spans DROP NOT NULL;
ALTER TABLE trace_span_sets ALTER COLUMN spans_text SET STORAGE MAIN;
-- One of the two, never both or neither. NOT VALID: no scan of the rows stored before.
ALTER TABLE trace_span_sets ADD CONSTRAINT trace_span_sets_one_form
    CHECK ((spans IS NULL) <> (spans_text IS NULL)) NOT VALID;

-- The view reads either form; its columns are those it had.
CREATE OR REPLACE VIEW trace_spans AS
SELECT b.trace_id, s.span_id, s.parent_span_id, b.run_id, b.tenant_id, s.name, s.kind,
    s.start_time, s.end_time, s.duration_ms, s.status, s.error,
    COALESCE(s.attributes, '{}') AS attributes, COALESCE(s.events, '[]') AS events
FROM trace_span_sets b
CROSS JOIN LATERAL jsonb_to_recordset(COALESCE(b.spans, b.spans_text::jsonb)) AS s(
    span_id text, parent_span_id text, name text, kind text, start_time timestamptz,
    end_time timestamptz, duration_ms double precision, status text, error text,
    attributes jsonb, events jsonb);
