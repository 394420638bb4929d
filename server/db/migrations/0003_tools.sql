-- Tool runtime: the exactly-once tool ledger, approval records, per-tenant tool config.

-- The roles of whoever started the run: the tenant's grants turn them into tool permissions.
ALTER TABLE runs ADD COLUMN principal_roles text[] NOT NULL DEFAULT '{}';

-- One row per (run, tool call id). `generation` is the lease generation of the attempt that
-- owns the row; only that attempt may record the outcome (see tools/ledger.py).
CREATE TABLE tool_ledger (
    run_id           text NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    tool_call_id     text NOT NULL,
    tenant_id        text NOT NULL,
    tool_name        text NOT NULL,
    args             jsonb NOT NULL DEFAULT '{}',
    idempotency_key  text NOT NULL,
    status           text NOT NULL CHECK (status IN ('started', 'completed', 'failed')),
    generation       bigint NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    output           text,
    error            text,
    error_type       text,
    duration_ms      double precision,
    started_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    PRIMARY KEY (run_id, tool_call_id)
);

-- A human decision a run waits for: one row per tool call of a LangGraph interrupt.
CREATE TABLE approvals (
    id               text PRIMARY KEY,
    tenant_id        text NOT NULL,
    run_id           text NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    conversation_id  text NOT NULL,
    interrupt_id     text NOT NULL,
    kind             text NOT NULL CHECK (kind IN ('approval', 'in_doubt')),
    tool_call_id     text NOT NULL,
    tool_name        text NOT NULL,
    args             jsonb NOT NULL DEFAULT '{}',
    redact           text[] NOT NULL DEFAULT '{}',
    risk             text,
    source           text,
    reason           text NOT NULL DEFAULT '',
    status           text NOT NULL DEFAULT 'pending' CHECK (status IN
                       ('pending', 'approved', 'rejected', 'edited', 'expired', 'cancelled')),
    decision_reason  text,
    edited_args      jsonb,
    decided_by       text,
    decided_at       timestamptz,
    requested_at     timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz,
    UNIQUE (run_id, interrupt_id, tool_call_id)
);
CREATE INDEX approvals_tenant_pending ON approvals (tenant_id, requested_at)
    WHERE status = 'pending';
CREATE INDEX approvals_run ON approvals (run_id, requested_at);
CREATE INDEX approvals_expiring ON approvals (expires_at)
    WHERE status = 'pending' AND expires_at IS NOT NULL;

-- A tenant admin's overlay on the operator's tool config (tools/config.py TenantToolConfig).
CREATE TABLE tenant_tool_configs (
    tenant_id   text PRIMARY KEY,
    config      jsonb NOT NULL,
    updated_by  text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
