-- Artifacts (docs/artifacts.md): files tools write, stored in object storage or under the data
-- folder; here their records. An artifact is a name within a conversation; each write of the
-- name adds a version, and versions share the artifact's id.
CREATE TABLE artifacts (
    id               text PRIMARY KEY,
    tenant_id        text NOT NULL,
    user_id          text NOT NULL,
    conversation_id  text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    -- The run that wrote its first version; each version names its own run.
    run_id           text NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    name             text NOT NULL,
    -- The newest version whose content is stored (0 while the first is being written).
    latest_version   integer NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (conversation_id, name)
);
CREATE INDEX artifacts_tenant ON artifacts (tenant_id, updated_at);

CREATE TABLE artifact_versions (
    artifact_id      text NOT NULL REFERENCES artifacts (id) ON DELETE CASCADE,
    version          integer NOT NULL CHECK (version >= 1),
    tenant_id        text NOT NULL,
    run_id           text NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    -- The tool call that wrote it (the tool message in the conversation's thread).
    tool_call_id     text NOT NULL,
    -- The call's idempotency key: a call run again finds its version instead of adding one.
    idempotency_key  text NOT NULL UNIQUE,
    media_type       text NOT NULL,
    size             bigint,
    checksum         text,
    metadata         jsonb NOT NULL DEFAULT '{}',
    object_key       text NOT NULL,
    -- `writing` until the content is stored; a `writing` row left by a crash is either
    -- finished by the call's next run or removed by `agentrt db prune`.
    status           text NOT NULL DEFAULT 'writing' CHECK (status IN ('writing', 'ready')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    stored_at        timestamptz,
    PRIMARY KEY (artifact_id, version)
);
CREATE INDEX artifact_versions_run ON artifact_versions (run_id);
CREATE INDEX artifact_versions_age ON artifact_versions (tenant_id, created_at);
