-- A write's spans of one trace in one row (docs/decisions/2033). A run made about ten span
-- rows, each with its own heap tuple and two index entries, none large enough for Postgres to
-- compress: a sixth of the WAL a run wrote. Now each write of the span sink stores one row per
-- trace, its spans a JSON array that Postgres compresses once the row passes 2 KiB. Storage
-- `main` keeps the compressed array on the row's page rather than in the TOAST table, and the
-- ids with it: with `extended`, a row still over 2 KiB once compressed had its short ids
-- moved to the TOAST table, two more rows and index entries for 70 bytes.
--
-- `trace_spans` stays, as a view with one row per span and the columns it had: the API, the
-- retention and erasure jobs and anyone's SQL read it; writes and deletes go to the sets.

CREATE TABLE trace_span_sets (
    trace_id    text NOT NULL,
    set_id      text NOT NULL,          -- written again after a commit in doubt: skipped
    run_id      text,
    tenant_id   text,
    start_time  timestamptz NOT NULL,   -- the earliest span's start: the partition's day
    span_count  integer NOT NULL CHECK (span_count > 0),
    spans       jsonb NOT NULL,         -- [{span_id, parent_span_id, name, kind, start_time,
                                        --   end_time, duration_ms, status, error, attributes,
                                        --   events}], null and empty members left out
    PRIMARY KEY (trace_id, set_id, start_time)
) PARTITION BY RANGE (start_time);
ALTER TABLE trace_span_sets
    ALTER COLUMN trace_id SET STORAGE MAIN, ALTER COLUMN set_id SET STORAGE MAIN,
    ALTER COLUMN run_id SET STORAGE MAIN, ALTER COLUMN tenant_id SET STORAGE MAIN,
    ALTER COLUMN spans SET STORAGE MAIN;
CREATE INDEX trace_span_sets_run ON trace_span_sets (run_id, start_time);
CREATE TABLE trace_span_sets_default PARTITION OF trace_span_sets DEFAULT;

SELECT agentrt_ensure_day_partitions(
    'trace_span_sets',
    COALESCE((SELECT (min(start_time) AT TIME ZONE 'UTC')::date FROM trace_spans),
             (now() AT TIME ZONE 'UTC')::date),
    (now() AT TIME ZONE 'UTC')::date + 7);

-- The spans stored so far: one set per trace, run and day.
INSERT INTO trace_span_sets (trace_id, set_id, run_id, tenant_id, start_time, span_count, spans)
SELECT trace_id, min(span_id), run_id, tenant_id, min(start_time), count(*),
    jsonb_agg(jsonb_build_object(
        'span_id', span_id, 'parent_span_id', parent_span_id, 'name', name, 'kind', kind,
        'start_time', start_time, 'end_time', end_time, 'duration_ms', duration_ms,
        'status', status, 'error', error, 'attributes', attributes, 'events', events)
        ORDER BY start_time, span_id)
FROM trace_spans
GROUP BY trace_id, run_id, tenant_id, (start_time AT TIME ZONE 'UTC')::date;

DROP TABLE trace_spans;

CREATE VIEW trace_spans AS
SELECT b.trace_id, s.span_id, s.parent_span_id, b.run_id, b.tenant_id, s.name, s.kind,
    s.start_time, s.end_time, s.duration_ms, s.status, s.error,
    COALESCE(s.attributes, '{}') AS attributes, COALESCE(s.events, '[]') AS events
FROM trace_span_sets b
CROSS JOIN LATERAL jsonb_to_recordset(b.spans) AS s(
    span_id text, parent_span_id text, name text, kind text, start_time timestamptz,
    end_time timestamptz, duration_ms double precision, status text, error text,
    attributes jsonb, events jsonb);
