-- Agent profiles: named, versioned configurations per tenant. Every change inserts a new
-- immutable version; deleting marks the name deleted (its versions stay, runs name them).

CREATE TABLE agent_profiles (
    tenant_id   text NOT NULL,
    name        text NOT NULL,
    version     integer NOT NULL CHECK (version >= 1),
    spec        jsonb NOT NULL,
    source      text NOT NULL DEFAULT 'api' CHECK (source IN ('api', 'file')),
    source_path text,
    created_by  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz,
    PRIMARY KEY (tenant_id, name, version)
);

-- The agent a conversation uses unless a message names another.
ALTER TABLE conversations ADD COLUMN agent text;
-- The exact profile version a run used (version 0: the built-in default).
ALTER TABLE runs ADD COLUMN agent_name text NOT NULL DEFAULT 'default';
ALTER TABLE runs ADD COLUMN agent_version integer NOT NULL DEFAULT 0;
