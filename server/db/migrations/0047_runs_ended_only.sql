-- `runs_ended` holds ended runs only (docs/decisions/2043). It held every run whose log had
-- not expired, live ones included, so each version of a live run's row (its insert, its
-- claim) wrote an entry no reader used: the retention looks for ended runs only
-- (`finished_at IS NOT NULL`, server/lifecycle/retention.py), which the new predicate lets
-- it still use the index for. The index is built anew under the table's SHARE lock
-- (appends wait while it is built: one entry per ended run whose log is kept).
DROP INDEX runs_ended;
CREATE INDEX runs_ended ON runs (finished_at)
    WHERE events_expired_at IS NULL AND finished_at IS NOT NULL;
