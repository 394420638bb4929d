-- A conversation's runs still in progress, found without reading its finished ones
-- (docs/decisions/2059). A conversation runs one run at a time, in order: the claim passes
-- over a queued run while an earlier run of its conversation is in progress, and a post that
-- rejects or interrupts a busy conversation finds its runs in progress. Both read
-- `runs_conversation`, which holds every run the conversation ever had, and tested each
-- one's status: a claim cost about 1.4 µs more for each finished run of the conversation it
-- looked at, under the claim's lock.
--
-- A run's `finished_at` is set by the append that ends it, and by nothing else: it is NULL
-- exactly while the run is in progress (no status leaves an end). Its status flips in
-- progress do not name it, so they stay HOT updates; the run's end already writes its row
-- anew (`runs_ended` names `finished_at`).
CREATE INDEX runs_open_by_conversation ON runs (conversation_id, created_at)
    WHERE finished_at IS NULL;
