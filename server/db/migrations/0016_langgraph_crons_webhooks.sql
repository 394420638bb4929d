-- The LangGraph API's crons and webhooks (docs/langgraph.md).

-- A cron starts a run of an assistant on a schedule, on its thread or on a new thread each
-- time. Workers claim a due cron with FOR UPDATE SKIP LOCKED and advance `next_run_at` in the
-- transaction that records the firing, so each due time fires once whatever the workers.
CREATE TABLE lg_crons (
    cron_id      text PRIMARY KEY,
    tenant_id    text NOT NULL,
    user_id      text NOT NULL,
    roles        text[] NOT NULL DEFAULT '{}',
    thread_id    text REFERENCES conversations (id) ON DELETE CASCADE,
    assistant_id text NOT NULL,
    schedule     text NOT NULL,
    timezone     text NOT NULL DEFAULT 'UTC',
    payload      jsonb NOT NULL DEFAULT '{}',
    metadata     jsonb NOT NULL DEFAULT '{}',
    enabled      boolean NOT NULL DEFAULT true,
    end_time     timestamptz,
    next_run_at  timestamptz NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX lg_crons_due ON lg_crons (next_run_at) WHERE enabled;
CREATE INDEX lg_crons_tenant ON lg_crons (tenant_id, created_at DESC);

-- One row per due time of a cron: its primary key makes a firing unique; `run_id` is set once
-- the run exists, and a firing left without one (its worker died) is started again.
CREATE TABLE lg_cron_firings (
    cron_id    text NOT NULL REFERENCES lg_crons (cron_id) ON DELETE CASCADE,
    due_at     timestamptz NOT NULL,
    run_id     text,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cron_id, due_at)
);
CREATE INDEX lg_cron_firings_unstarted ON lg_cron_firings (claimed_at) WHERE run_id IS NULL;

-- A run's webhook: POSTed when the run ends, retried with backoff until it answers 2xx or the
-- attempts run out. Claimed with a lease, like every job.
CREATE TABLE lg_webhooks (
    run_id          text PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    url             text NOT NULL,
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_until     timestamptz,
    delivered_at    timestamptz,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX lg_webhooks_pending ON lg_webhooks (next_attempt_at)
    WHERE delivered_at IS NULL;
