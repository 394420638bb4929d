-- The LangGraph API's delayed runs and self-deleting threads (docs/langgraph.md).

-- A run that must not start before this time (`after_seconds`): the claim skips it until
-- then. NULL (every other run) starts as soon as a worker is free.
ALTER TABLE runs ADD COLUMN not_before timestamptz;

-- Threads deleted on their own: once run `run_id` has ended (`on_completion: delete` of a
-- stateless run, a cron's `on_run_completed: delete`), or when `expires_at` passes (a thread
-- `ttl`, pushed back by `ttl_minutes` on every read). The LangGraph jobs of the workers
-- sweep them, so a crash between the run's end and the deletion leaks nothing.
CREATE TABLE lg_thread_expiry (
    thread_id   text PRIMARY KEY REFERENCES conversations (id) ON DELETE CASCADE,
    run_id      text,
    ttl_minutes double precision,
    expires_at  timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX lg_thread_expiry_due ON lg_thread_expiry (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX lg_thread_expiry_run ON lg_thread_expiry (run_id) WHERE run_id IS NOT NULL;
