-- Long-term memory (docs/memory.md). The memories themselves live in LangGraph's store tables
-- (`store`, `store_vectors`, created by AsyncPostgresStore.setup()); here: the durable
-- extraction jobs and the embeddings' usage ledger.

-- One extraction job per completed run whose profile extracts automatically; inserted in the
-- transaction that completes the run, claimed with FOR UPDATE SKIP LOCKED and a lease.
CREATE TABLE memory_jobs (
    id               text PRIMARY KEY,
    run_id           text NOT NULL UNIQUE REFERENCES runs (id) ON DELETE CASCADE,
    tenant_id        text NOT NULL,
    user_id          text NOT NULL,
    status           text NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'running', 'done', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    lease_owner      text,
    lease_expires_at timestamptz,
    -- The model's decision, saved (with its usage event) before any memory is written, so a
    -- retried job applies the same decision instead of asking (and paying) again.
    plan             jsonb,
    result           jsonb,
    error            text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz
);
CREATE INDEX memory_jobs_ready ON memory_jobs (created_at) WHERE status IN ('queued', 'running');

-- Every embedding request: who it was for, tokens, cost (NULL: price unknown).
CREATE TABLE embedding_calls (
    id            text PRIMARY KEY,
    tenant_id     text,
    user_id       text,
    run_id        text,
    purpose       text NOT NULL,
    provider      text NOT NULL,
    model         text NOT NULL,
    model_id      text NOT NULL,
    inputs        integer NOT NULL,
    input_tokens  integer NOT NULL,
    cost          numeric,
    price_source  text,
    status        text NOT NULL,
    error_class   text,
    attempts      integer NOT NULL,
    latency_ms    double precision NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX embedding_calls_tenant_day ON embedding_calls (tenant_id, created_at);
CREATE INDEX embedding_calls_run ON embedding_calls (run_id) WHERE run_id IS NOT NULL;
