-- Room on each page of `runs` for the new versions of its rows (docs/decisions/2027). A run's
-- row is updated at every append while the run goes on; the update is HOT (no entry in any of
-- the table's indexes) only if no indexed column changes and the new version fits on the
-- row's page. Filled to the brim, a page had no room left: a quarter of the updates that
-- changed no indexed column went to another page, and every index of `runs` got an entry.
-- Applies to the pages filled from now on; ALTER TABLE takes a lock that reads and writes pass.
ALTER TABLE runs SET (fillfactor = 70);
