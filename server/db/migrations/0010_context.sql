-- What went into every model call (one manifest per run, step and attempt), and the running
-- summaries of conversations, versioned by how many messages they cover.

CREATE TABLE context_manifests (
    run_id          text NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step            integer NOT NULL,
    attempt         integer NOT NULL,
    event_seq       bigint NOT NULL,
    tenant_id       text NOT NULL,
    model           text,
    agent_name      text,
    agent_version   integer,
    window_tokens   integer,
    total_tokens    integer,
    manifest        jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, step, attempt)
);

-- Filled from the `context.built` events as they are stored, in the same transaction, by
-- whichever path (statement or COPY) stored them.
CREATE FUNCTION agentrt_store_context_manifest() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO context_manifests (run_id, step, attempt, event_seq, tenant_id, model,
        agent_name, agent_version, window_tokens, total_tokens, manifest, created_at)
    SELECT NEW.run_id, (NEW.data->>'step')::integer,
        COALESCE((NEW.data->>'attempt')::integer, NEW.attempt), NEW.seq, r.tenant_id,
        NEW.data->>'model', NEW.data->'profile'->>'name',
        (NEW.data->'profile'->>'version')::integer, (NEW.data->>'window')::integer,
        (NEW.data->>'totalTokens')::integer, NEW.data, NEW.ts
    FROM runs r WHERE r.id = NEW.run_id
    ON CONFLICT (run_id, step, attempt) DO UPDATE
        SET event_seq = EXCLUDED.event_seq, manifest = EXCLUDED.manifest,
            total_tokens = EXCLUDED.total_tokens, created_at = EXCLUDED.created_at;
    RETURN NULL;
END $$;

CREATE TRIGGER run_events_context_manifest AFTER INSERT ON run_events
    FOR EACH ROW WHEN (NEW.type = 'context.built')
    EXECUTE FUNCTION agentrt_store_context_manifest();

CREATE TABLE context_summaries (
    conversation_id  text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    covers           integer NOT NULL CHECK (covers >= 1),
    tenant_id        text NOT NULL,
    run_id           text,
    first_message_id text NOT NULL,
    last_message_id  text NOT NULL,
    text             text NOT NULL,
    tokens           integer NOT NULL,
    model            text NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, covers)
);
