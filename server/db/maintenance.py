"""Housekeeping: checkpoint retention, so the checkpoint tables do not grow without bound."""

from __future__ import annotations

import logging

from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from server.db.pool import Pool
from server.domain import IN_PROGRESS, status_in

log = logging.getLogger(__name__)

_PRUNE_LOCK = 7_262_616_003

# Threads (= conversations) with checkpoints older than the cut-off whose runs have all
# ended, and ended before it. A conversation with a run in progress is never touched.
_PRUNABLE = f"""
SELECT c.id FROM conversations c
WHERE EXISTS (SELECT 1 FROM runs r WHERE r.conversation_id = c.id)
  AND NOT EXISTS (
      SELECT 1 FROM runs r WHERE r.conversation_id = c.id
        AND ({status_in(IN_PROGRESS, "r.status")}
             OR r.finished_at > now() - make_interval(secs => %(keep)s)))
  AND (SELECT count(*) FROM checkpoints k WHERE k.thread_id = c.id) > 1
ORDER BY c.created_at
LIMIT %(batch)s
"""


async def prune_checkpoints(
    pool: Pool, checkpointer: AsyncPostgresSaver, *, retention_days: float, batch: int = 500
) -> int:
    """Keep only the latest checkpoint of conversations idle for `retention_days`.

    The latest checkpoint is what the next message on the conversation resumes from, so
    nothing a user can reach is lost; the event log, messages and run records stay. Runs in
    one process at a time (advisory lock); returns the number of threads pruned.
    """
    total = 0
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (_PRUNE_LOCK,))
        row = await cur.fetchone()
        if not row or not row["ok"]:
            return 0
        try:
            while True:
                cur = await conn.execute(
                    _PRUNABLE, {"keep": retention_days * 86400, "batch": batch}
                )
                threads = [r["id"] for r in await cur.fetchall()]
                if not threads:
                    break
                await checkpointer.aprune(threads, strategy="keep_latest")
                total += len(threads)
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (_PRUNE_LOCK,))
    if total:
        log.info("pruned old checkpoints of %d conversations", total)
    return total
