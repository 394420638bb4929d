-- Assistants of the LangGraph API created through it (docs/langgraph.md); each graph's
-- default assistant is not stored. Every update adds a version; `version` is the one in use.
CREATE TABLE lg_assistants (
    assistant_id text PRIMARY KEY,
    tenant_id    text NOT NULL,
    graph_id     text NOT NULL,
    version      integer NOT NULL DEFAULT 1,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX lg_assistants_tenant ON lg_assistants (tenant_id, created_at DESC);

CREATE TABLE lg_assistant_versions (
    assistant_id text NOT NULL REFERENCES lg_assistants (assistant_id) ON DELETE CASCADE,
    version      integer NOT NULL,
    graph_id     text NOT NULL,
    name         text NOT NULL,
    description  text,
    config       jsonb NOT NULL DEFAULT '{}',
    context      jsonb NOT NULL DEFAULT '{}',
    metadata     jsonb NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (assistant_id, version)
);
