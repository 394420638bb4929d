-- Subagents (docs/subagents.md): a child run points at the run that delegated to it, and each
-- delegation (one `delegate` tool call of a parent) is recorded once, whatever the replays.

ALTER TABLE runs ADD COLUMN parent_run_id text REFERENCES runs (id) ON DELETE CASCADE;
ALTER TABLE runs ADD COLUMN depth integer NOT NULL DEFAULT 0;
CREATE INDEX runs_parent ON runs (parent_run_id, created_at) WHERE parent_run_id IS NOT NULL;

-- Keyed like the tool ledger, by (run, tool call id): a replayed parent step finds its child
-- here instead of spawning another. A retry points the delegation at a new child run.
CREATE TABLE subagent_calls (
    parent_run_id  text NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    tool_call_id   text NOT NULL,
    tenant_id      text NOT NULL,
    child_run_id   text REFERENCES runs (id) ON DELETE SET NULL,
    agent          text NOT NULL,
    task           text NOT NULL,
    spec           jsonb NOT NULL DEFAULT '{}',
    -- Why no child was started (depth, limits, unknown profile); NULL when one was.
    refusal        text,
    children       integer NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (parent_run_id, tool_call_id)
);
CREATE UNIQUE INDEX subagent_calls_child ON subagent_calls (child_run_id);
