-- A span set is dated by its latest span's end, not its earliest span's start
-- (docs/decisions/2033). The date picks the set's day partition, and so when the retention
-- drops it. A run's last set holds its root span, which starts when the run was created: a run
-- that waited in the queue or for an approval longer than the span retention had that set
-- stored into a day already dropped (the default partition), and the next retention pass
-- deleted it at once. Dated by the end, it is kept as long as any other set stored that day,
-- as its cut payloads are (`trace_payloads` is dated by when it was stored). Sets stored before
-- keep their dates. Renaming a column takes a brief exclusive lock; nothing is rewritten.
ALTER TABLE trace_span_sets RENAME COLUMN start_time TO ended_at;
