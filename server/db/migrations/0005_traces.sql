-- Traces: every span of every run, stored so a trace is available without a collector.

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
    PRIMARY KEY (trace_id, span_id)
);
CREATE INDEX trace_spans_run ON trace_spans (run_id, start_time);

-- Full inputs and outputs of spans whose attributes carry a cut-down copy.
CREATE TABLE trace_payloads (
    trace_id  text NOT NULL,
    span_id   text NOT NULL,
    kind      text NOT NULL CHECK (kind IN ('input', 'output')),
    data      jsonb NOT NULL,
    PRIMARY KEY (trace_id, span_id, kind)
);
