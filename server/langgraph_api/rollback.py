"""Rollback: remove what interrupted runs wrote to a thread, so it is as before them."""

from __future__ import annotations

from server.db.pool import Pool


async def delete_run_checkpoints(pool: Pool, thread_id: str, run_ids: list[str]) -> None:
    """Remove the checkpoints (and pending writes) that `run_ids` wrote on the thread."""
    if not run_ids:
        return
    async with pool.connection() as conn, conn.transaction():
        chosen = (
            "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %(t)s"
            " AND metadata ->> 'run_id' = ANY(%(r)s)"
        )
        params = {"t": thread_id, "r": run_ids}
        await conn.execute(
            "DELETE FROM checkpoint_writes WHERE thread_id = %(t)s"
            f" AND checkpoint_id IN ({chosen})",
            params,
        )
        await conn.execute(
            "DELETE FROM checkpoints WHERE thread_id = %(t)s"
            " AND metadata ->> 'run_id' = ANY(%(r)s)",
            params,
        )
