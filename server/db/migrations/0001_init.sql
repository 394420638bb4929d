-- Core tables: principals, conversations, messages, runs and the per-run event log.

CREATE TABLE api_keys (
    id          text PRIMARY KEY,
    tenant_id   text NOT NULL,
    user_id     text NOT NULL,
    roles       text[] NOT NULL DEFAULT '{}',
    key_hash    text NOT NULL UNIQUE,
    label       text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

CREATE TABLE conversations (
    id          text PRIMARY KEY,
    tenant_id   text NOT NULL,
    user_id     text NOT NULL,
    title       text,
    model       text,
    metadata    jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX conversations_tenant_user ON conversations (tenant_id, user_id, created_at DESC);

CREATE TABLE runs (
    id                 text PRIMARY KEY,
    conversation_id    text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    tenant_id          text NOT NULL,
    user_id            text NOT NULL,
    status             text NOT NULL DEFAULT 'queued' CHECK (status IN
                         ('queued', 'running', 'waiting_tool', 'waiting_user', 'paused',
                          'completed', 'failed', 'cancelled')),
    model              text NOT NULL,
    options            jsonb NOT NULL DEFAULT '{}',
    input_message_id   text NOT NULL,
    output_message_id  text,
    attempt            integer NOT NULL DEFAULT 0,
    error_type         text,
    error_message      text,
    last_event_seq     bigint NOT NULL DEFAULT 0,
    snapshot           jsonb NOT NULL DEFAULT '{}',
    usage              jsonb NOT NULL DEFAULT '{}',
    cancel_requested   boolean NOT NULL DEFAULT false,
    lease_owner        text,
    lease_generation   bigint NOT NULL DEFAULT 0,
    lease_expires_at   timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    started_at         timestamptz,
    finished_at        timestamptz,
    updated_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX runs_conversation ON runs (conversation_id, created_at);
CREATE INDEX runs_tenant_created ON runs (tenant_id, created_at DESC);
CREATE INDEX runs_queued ON runs (created_at) WHERE status = 'queued';
CREATE INDEX runs_leased ON runs (lease_expires_at)
    WHERE status IN ('running', 'waiting_tool');

CREATE TABLE messages (
    id               text PRIMARY KEY,
    conversation_id  text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    tenant_id        text NOT NULL,
    user_id          text NOT NULL,
    run_id           text,
    role             text NOT NULL CHECK (role IN ('user', 'assistant', 'system', 'tool')),
    content          text NOT NULL,
    position         bigserial,
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX messages_conversation ON messages (conversation_id, position);

-- One row per event; seq is gapless per run and allocated under the run's row lock.
CREATE TABLE run_events (
    run_id     text NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq        bigint NOT NULL,
    type       text NOT NULL,
    ts         timestamptz NOT NULL DEFAULT now(),
    attempt    integer NOT NULL DEFAULT 0,
    data       jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (run_id, seq)
);
