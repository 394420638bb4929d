-- Operator pause: a running run is asked to stop at its next step boundary; paused time is
-- kept so that resuming can push the wall-clock deadline back by it.

ALTER TABLE runs ADD COLUMN pause_requested boolean NOT NULL DEFAULT false;
ALTER TABLE runs ADD COLUMN paused_at timestamptz;
