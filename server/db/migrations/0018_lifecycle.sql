-- Data lifecycle (docs/operations.md "Data lifecycle"): the audit log, per-tenant retention,
-- resumable erasures, the daily roll-up of expired ledger rows, and expired event logs.

-- Security-relevant actions: who did what to which target, with a small diff and no secrets.
CREATE TABLE audit_log (
    id         bigserial PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    tenant_id  text NOT NULL,
    actor      text NOT NULL,
    action     text NOT NULL,
    target     text NOT NULL,
    diff       jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_log_tenant ON audit_log (tenant_id, id);
CREATE INDEX audit_log_at ON audit_log (at);

-- Append-only: rows are never changed; only the audit retention deletes old ones.
CREATE FUNCTION agentrt_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only' USING ERRCODE = 'AR002';
END $$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION agentrt_audit_append_only();

-- A tenant's overrides of the installation's retention (NULL: the installation default).
CREATE TABLE tenant_retention (
    tenant_id    text PRIMARY KEY,
    events_days  integer CHECK (events_days >= 1),
    spans_days   integer CHECK (spans_days >= 1),
    ledger_days  integer CHECK (ledger_days >= 1),
    audit_days   integer CHECK (audit_days >= 1),
    updated_by   text NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- One erasure of a conversation or of a user's data; `done` lists the finished steps so that
-- an erasure interrupted by a crash resumes where it stopped.
CREATE TABLE erasures (
    id            text PRIMARY KEY,
    tenant_id     text NOT NULL,
    scope         text NOT NULL CHECK (scope IN ('conversation', 'user')),
    subject       text NOT NULL,
    requested_by  text NOT NULL,
    status        text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'done')),
    done          text[] NOT NULL DEFAULT '{}',
    counts        jsonb NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz
);
CREATE UNIQUE INDEX erasures_one_running ON erasures (tenant_id, scope, subject)
    WHERE status = 'running';
CREATE INDEX erasures_subject ON erasures (tenant_id, scope, subject, created_at);

-- Model-call ledger rows past the ledger retention, summed per tenant, user, day and model.
CREATE TABLE model_usage_daily (
    tenant_id            text NOT NULL,
    user_id              text NOT NULL,
    day                  date NOT NULL,
    provider             text NOT NULL,
    model                text NOT NULL,
    calls                bigint NOT NULL,
    failed_calls         bigint NOT NULL,
    input_tokens         bigint NOT NULL,
    output_tokens        bigint NOT NULL,
    cached_input_tokens  bigint NOT NULL,
    reasoning_tokens     bigint NOT NULL,
    total_tokens         bigint NOT NULL,
    cost                 numeric(24, 10) NOT NULL,
    unpriced_calls       bigint NOT NULL,
    PRIMARY KEY (tenant_id, user_id, day, provider, model)
);

-- Set when the retention drops a run's event log; the record, snapshot and usage stay.
ALTER TABLE runs ADD COLUMN events_expired_at timestamptz;
CREATE INDEX runs_ended ON runs (finished_at) WHERE events_expired_at IS NULL;
