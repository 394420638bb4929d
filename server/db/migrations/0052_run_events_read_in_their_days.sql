-- A run's events read from the daily partitions of its lifetime only (docs/decisions/2058).
-- Reads bound `ts` by the run's `created_at` and `updated_at`, a day of margin each side. Taken
-- from the run's row in the same statement, those bounds are known only as the statement
-- runs, so Postgres set up a scan of every partition of the log at each execution (a few µs
-- each) and skipped them only then: a claim or a replay paid for every day the retention
-- keeps. Here they are values when the read's plan starts, and it sets up only the
-- partitions they reach. The generic plan is kept (`plan_cache_mode`): a custom plan would
-- be planned again at every call.
CREATE FUNCTION agentrt_run_events(run text, after bigint, upto bigint, lim bigint)
RETURNS SETOF run_events LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    lo timestamptz;
    hi timestamptz;
BEGIN
    SELECT r.created_at - interval '1 day', r.updated_at + interval '1 day' INTO lo, hi
    FROM runs r WHERE r.id = run;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT e.* FROM run_events e
        WHERE e.run_id = run AND e.seq > after AND (upto IS NULL OR e.seq <= upto)
          AND e.ts >= lo AND e.ts <= hi
        ORDER BY e.seq LIMIT lim;
END $$;
