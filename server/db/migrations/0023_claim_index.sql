-- The claim walks each leaseholding user's queued runs oldest first (docs/decisions/1900).

CREATE INDEX runs_queued_by_user ON runs (tenant_id, user_id, created_at)
    WHERE status = 'queued';
