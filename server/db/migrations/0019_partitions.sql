-- The event log, spans and span payloads, partitioned by day (UTC) so that retention drops
-- whole partitions instead of deleting rows (docs/decisions/2000). An existing table is
-- converted in this migration's transaction: every row is copied, none is lost.

-- Create the daily partitions of `parent` for the days `first_day` to `last_day` that do not
-- exist yet; return how many were created. A day whose rows already sit in the DEFAULT
-- partition (written while no partition covered it) is skipped, with a warning.
CREATE FUNCTION agentrt_ensure_day_partitions(parent text, first_day date, last_day date)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    day date := first_day;
    made integer := 0;
    part text;
BEGIN
    WHILE day <= last_day LOOP
        part := parent || '_' || to_char(day, 'YYYYMMDD');
        IF to_regclass(part) IS NULL THEN
            BEGIN
                EXECUTE format(
                    'CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                    part, parent,
                    (day::timestamp AT TIME ZONE 'UTC'),
                    ((day + 1)::timestamp AT TIME ZONE 'UTC'));
                made := made + 1;
            EXCEPTION WHEN check_violation THEN
                RAISE WARNING 'partition % not created: its rows are in %_default', part, parent;
            END;
        END IF;
        day := day + 1;
    END LOOP;
    RETURN made;
END $$;

-- run_events --------------------------------------------------------------------------------
ALTER TABLE run_events RENAME TO run_events_unpartitioned;
ALTER TABLE run_events_unpartitioned RENAME CONSTRAINT run_events_pkey
    TO run_events_unpartitioned_pkey;
DROP TRIGGER run_events_context_manifest ON run_events_unpartitioned;

-- The key holds `ts` because a partitioned table's keys must hold its partition key; `seq`
-- stays gapless and unique per run because appends allocate it under the run's row.
CREATE TABLE run_events (
    run_id     text NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq        bigint NOT NULL,
    type       text NOT NULL,
    ts         timestamptz NOT NULL DEFAULT now(),
    attempt    integer NOT NULL DEFAULT 0,
    data       jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (run_id, seq, ts)
) PARTITION BY RANGE (ts);
-- Catches events of a day the housekeeping job has not created (yet): none is refused.
CREATE TABLE run_events_default PARTITION OF run_events DEFAULT;

SELECT agentrt_ensure_day_partitions(
    'run_events',
    COALESCE((SELECT (min(ts) AT TIME ZONE 'UTC')::date FROM run_events_unpartitioned),
             (now() AT TIME ZONE 'UTC')::date),
    (now() AT TIME ZONE 'UTC')::date + 7);
INSERT INTO run_events SELECT run_id, seq, type, ts, attempt, data FROM run_events_unpartitioned;
DROP TABLE run_events_unpartitioned;

CREATE TRIGGER run_events_context_manifest AFTER INSERT ON run_events
    FOR EACH ROW WHEN (NEW.type = 'context.built')
    EXECUTE FUNCTION agentrt_store_context_manifest();

-- trace_spans -------------------------------------------------------------------------------
ALTER TABLE trace_spans RENAME TO trace_spans_unpartitioned;
ALTER TABLE trace_spans_unpartitioned RENAME CONSTRAINT trace_spans_pkey
    TO trace_spans_unpartitioned_pkey;
ALTER INDEX trace_spans_run RENAME TO trace_spans_unpartitioned_run;

CREATE TABLE trace_spans (
    trace_id        text NOT NULL,
    span_id         text NOT NULL,
    parent_span_id  text,
    run_id          text,
    tenant_id       text,
    name            text NOT NULL,
    kind            text NOT NULL,
    start_time      timestamptz NOT NULL,
    end_time        timestamptz NOT NULL,
    duration_ms     double precision NOT NULL,
    status          text NOT NULL,
    error           text,
    attributes      jsonb NOT NULL DEFAULT '{}',
    events          jsonb NOT NULL DEFAULT '[]',
    PRIMARY KEY (trace_id, span_id, start_time)
) PARTITION BY RANGE (start_time);
CREATE INDEX trace_spans_run ON trace_spans (run_id, start_time);
CREATE TABLE trace_spans_default PARTITION OF trace_spans DEFAULT;

SELECT agentrt_ensure_day_partitions(
    'trace_spans',
    COALESCE((SELECT (min(start_time) AT TIME ZONE 'UTC')::date FROM trace_spans_unpartitioned),
             (now() AT TIME ZONE 'UTC')::date),
    (now() AT TIME ZONE 'UTC')::date + 7);
INSERT INTO trace_spans SELECT * FROM trace_spans_unpartitioned;
DROP TABLE trace_spans_unpartitioned;

-- trace_payloads: partitioned by when they were stored --------------------------------------
ALTER TABLE trace_payloads RENAME TO trace_payloads_unpartitioned;
ALTER TABLE trace_payloads_unpartitioned RENAME CONSTRAINT trace_payloads_pkey
    TO trace_payloads_unpartitioned_pkey;

CREATE TABLE trace_payloads (
    trace_id    text NOT NULL,
    span_id     text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('input', 'output')),
    data        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (trace_id, span_id, kind, created_at)
) PARTITION BY RANGE (created_at);
CREATE TABLE trace_payloads_default PARTITION OF trace_payloads DEFAULT;

SELECT agentrt_ensure_day_partitions(
    'trace_payloads',
    COALESCE((SELECT (min(start_time) AT TIME ZONE 'UTC')::date FROM trace_spans),
             (now() AT TIME ZONE 'UTC')::date),
    (now() AT TIME ZONE 'UTC')::date + 7);
-- Payloads carried no time: they take their span's.
INSERT INTO trace_payloads (trace_id, span_id, kind, data, created_at)
SELECT p.trace_id, p.span_id, p.kind, p.data, COALESCE(s.start_time, now())
FROM trace_payloads_unpartitioned p
LEFT JOIN LATERAL (
    SELECT start_time FROM trace_spans s
    WHERE s.trace_id = p.trace_id AND s.span_id = p.span_id LIMIT 1
) s ON true;
DROP TABLE trace_payloads_unpartitioned;
