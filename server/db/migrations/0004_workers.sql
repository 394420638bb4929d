-- Durable execution: recovery counting, wall-clock deadlines, and the worker registry.

ALTER TABLE runs ADD COLUMN recoveries integer NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN deadline_at timestamptz;

CREATE INDEX runs_active_by_user ON runs (tenant_id, user_id)
    WHERE status IN ('running', 'waiting_tool');

CREATE TABLE workers (
    id                 text PRIMARY KEY,
    host               text NOT NULL,
    pid                integer NOT NULL,
    concurrency        integer NOT NULL,
    active_runs        integer NOT NULL DEFAULT 0,
    draining           boolean NOT NULL DEFAULT false,
    started_at         timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at  timestamptz NOT NULL DEFAULT now()
);
