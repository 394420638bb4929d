-- Knowledge bases (docs/knowledge.md): per-tenant document collections, their chunks with a
-- half-precision vector and a full-text vector, the durable ingestion jobs (the documents
-- rows themselves), and the evidence records of every retrieval.
CREATE EXTENSION IF NOT EXISTS vector;
CREATE EXTENSION IF NOT EXISTS pg_trgm;

CREATE TABLE knowledge_bases (
    id               text PRIMARY KEY,
    tenant_id        text NOT NULL,
    name             text NOT NULL,
    description      text,
    embedding_model  text NOT NULL,
    dims             integer NOT NULL,
    -- {"targetTokens", "overlapTokens"}
    chunking         jsonb NOT NULL,
    -- Empty: every profile (or role) of the tenant may search it.
    allowed_profiles text[] NOT NULL DEFAULT '{}',
    allowed_roles    text[] NOT NULL DEFAULT '{}',
    created_by       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);

-- A document is also its own ingestion job: claimed with FOR UPDATE SKIP LOCKED and a lease.
CREATE TABLE kb_documents (
    id               text PRIMARY KEY,
    kb_id            text NOT NULL REFERENCES knowledge_bases (id) ON DELETE CASCADE,
    tenant_id        text NOT NULL,
    title            text NOT NULL,
    source_url       text,
    media_type       text NOT NULL,
    content          bytea NOT NULL,
    content_hash     text NOT NULL,
    metadata         jsonb NOT NULL DEFAULT '{}',
    status           text NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'processing', 'ready', 'failed')),
    error            text,
    chunks_total     integer,
    chunks_done      integer NOT NULL DEFAULT 0,
    attempts         integer NOT NULL DEFAULT 0,
    lease_owner      text,
    lease_expires_at timestamptz,
    created_by       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    UNIQUE (kb_id, content_hash)
);
CREATE INDEX kb_documents_ready ON kb_documents (created_at)
    WHERE status IN ('queued', 'processing');
CREATE INDEX kb_documents_kb ON kb_documents (kb_id, created_at);

CREATE TABLE kb_chunks (
    id            text PRIMARY KEY,
    document_id   text NOT NULL REFERENCES kb_documents (id) ON DELETE CASCADE,
    kb_id         text NOT NULL,
    tenant_id     text NOT NULL,
    position      integer NOT NULL,
    heading_path  text[] NOT NULL DEFAULT '{}',
    page          integer,
    text          text NOT NULL,
    tokens        integer NOT NULL,
    -- Document title and headings: weighted above the text in full-text ranking.
    label         text NOT NULL,
    metadata      jsonb NOT NULL DEFAULT '{}',
    dims          integer NOT NULL,
    embedding     halfvec NOT NULL,
    tsv           tsvector GENERATED ALWAYS AS (
                      setweight(to_tsvector('english', label), 'A')
                      || setweight(to_tsvector('english', text), 'B')) STORED,
    UNIQUE (document_id, position)
);
CREATE INDEX kb_chunks_kb ON kb_chunks (kb_id);
CREATE INDEX kb_chunks_tsv ON kb_chunks USING gin (tsv);

-- Evidence: one record per retrieval (the tool's or the automatic one), filled from the
-- `retrieval.completed` events as they are stored, in the same transaction.
CREATE TABLE retrievals (
    id             text PRIMARY KEY,
    run_id         text NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    tenant_id      text NOT NULL,
    event_seq      bigint NOT NULL,
    mode           text NOT NULL,
    step           integer,
    tool_call_id   text,
    query          text NOT NULL,
    rewritten      text,
    knowledge_bases text[] NOT NULL,
    record         jsonb NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX retrievals_run ON retrievals (run_id, event_seq);

CREATE FUNCTION agentrt_store_retrieval() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO retrievals (id, run_id, tenant_id, event_seq, mode, step, tool_call_id, query,
        rewritten, knowledge_bases, record, created_at)
    SELECT NEW.data->>'retrievalId', NEW.run_id, r.tenant_id, NEW.seq, NEW.data->>'mode',
        (NEW.data->>'step')::integer, NEW.data->>'toolCallId', NEW.data->>'query',
        NEW.data->>'rewrittenQuery',
        ARRAY(SELECT jsonb_array_elements_text(NEW.data->'knowledgeBases')), NEW.data, NEW.ts
    FROM runs r WHERE r.id = NEW.run_id
    ON CONFLICT (id) DO NOTHING;
    RETURN NULL;
END $$;

CREATE TRIGGER run_events_retrieval AFTER INSERT ON run_events
    FOR EACH ROW WHEN (NEW.type = 'retrieval.completed')
    EXECUTE FUNCTION agentrt_store_retrieval();
