-- An append sent without reading its result (in a pipeline, with the transaction's other
-- statements) cannot see that it moved no run head: the head was not the appender's, and
-- the batch wrote nothing. Such an append ends with this check instead, which raises, so
-- that the whole transaction rolls back rather than committing the rest without the events
-- (docs/decisions/2013).
CREATE FUNCTION agentrt_appended(moved bigint, run text, woken bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF moved <> 1 THEN
        RAISE EXCEPTION 'run %: appended to by someone else', run USING ERRCODE = 'AR002';
    END IF;
    RETURN woken;
END
$$;
