-- The usage and cost ledger: one row per model call (every attempt, failed ones too).
-- Rows are written in the same transaction as the run's `usage` event (server/events/log.py),
-- so the ledger, the event log and the run's totals always agree. Money is numeric; a cost
-- of NULL means the price is unknown (never zero). See docs/usage.md.

CREATE TABLE model_calls (
    id                   text PRIMARY KEY,
    run_id               text NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    event_seq            bigint NOT NULL,
    tenant_id            text NOT NULL,
    user_id              text NOT NULL,
    conversation_id      text NOT NULL,
    step                 integer NOT NULL,
    attempt              integer NOT NULL,
    provider             text NOT NULL,
    model                text NOT NULL,
    model_id             text NOT NULL,
    requested_model      text NOT NULL,
    fallback_index       integer NOT NULL DEFAULT 0,
    status               text NOT NULL CHECK (status IN ('ok', 'failed')),
    input_tokens         integer,
    output_tokens        integer,
    cached_input_tokens  integer,
    reasoning_tokens     integer,
    total_tokens         integer,
    latency_ms           double precision NOT NULL,
    ttft_ms              double precision,
    cost                 numeric(20, 10),
    price_source         text,
    finish_reason        text,
    error_class          text,
    status_code          integer,
    created_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX model_calls_run ON model_calls (run_id, event_seq);
CREATE INDEX model_calls_tenant_day ON model_calls (tenant_id, created_at);
CREATE INDEX model_calls_tenant_user_day ON model_calls (tenant_id, user_id, created_at);

-- Why a run failed, beyond type and message (model error class, provider, attempts, budget).
ALTER TABLE runs ADD COLUMN error_details jsonb;
