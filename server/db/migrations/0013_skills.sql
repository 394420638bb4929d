-- Skills: every version of a skill is an immutable row. tenant_id '' holds the repository's
-- skills (the skills/ folder, synced on start-up), which every tenant sees; a tenant's own
-- upload of the same name takes their place for that tenant.

CREATE TABLE skill_versions (
    tenant_id     text NOT NULL,
    name          text NOT NULL,
    version       integer NOT NULL CHECK (version >= 1),
    content_hash  text NOT NULL,
    -- What listings show, so that they never parse SKILL.md.
    description   text NOT NULL,
    label         text NOT NULL,
    skill_md      text NOT NULL,
    resources     jsonb NOT NULL DEFAULT '{}',
    source        text NOT NULL CHECK (source IN ('repository', 'upload')),
    created_by    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name, version)
);
CREATE INDEX skill_versions_by_hash ON skill_versions (name, content_hash);

-- A tenant's choices about one skill name: off, or pinned to one version.
CREATE TABLE tenant_skills (
    tenant_id      text NOT NULL,
    name           text NOT NULL,
    enabled        boolean NOT NULL DEFAULT true,
    pinned_version integer,
    updated_by     text,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name)
);

-- Which exact version each run loaded (written from `skill.loaded` events).
CREATE TABLE skill_loads (
    run_id       text NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    name         text NOT NULL,
    tenant_id    text NOT NULL,
    owner        text NOT NULL,
    version      integer NOT NULL,
    content_hash text NOT NULL,
    via          text NOT NULL,
    event_seq    bigint NOT NULL,
    loaded_at    timestamptz NOT NULL,
    PRIMARY KEY (run_id, name)
);
CREATE INDEX skill_loads_by_skill ON skill_loads (tenant_id, name, loaded_at);

-- Skill folders of the repository that fail to parse, as the last start-up found them, so that
-- every process answers a load of one with the reason.
CREATE TABLE skill_errors (
    name       text PRIMARY KEY,
    error      text NOT NULL,
    found_at   timestamptz NOT NULL DEFAULT now()
);
