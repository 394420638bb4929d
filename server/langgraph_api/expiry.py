"""Threads that delete themselves: after their run (`on_completion`), or past their `ttl`.

Both are rows of `lg_thread_expiry`, written in the request that asks for them, and swept by
the LangGraph jobs of every worker (`sweep_threads`), so a crash between a run's end and its
thread's deletion only delays the deletion. A stream or wait that delivered a stateless
run's result deletes its thread at once (`delete_after_delivery`); the sweep gives such
threads `grace_s` after the run ended, so that a client still reading the result is not cut
off. A thread whose run still has a webhook to deliver waits for the delivery (or its last
attempt).
"""

from __future__ import annotations

import logging
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from server.db.pool import Conn, Pool
from server.domain import IN_PROGRESS, TERMINAL, status_in
from server.errors import InvalidGraphRequestError
from server.langgraph_api.bodies import MAX_TTL_MINUTES, MIN_TTL_MINUTES
from server.langgraph_api.webhooks import MAX_ATTEMPTS

log = logging.getLogger(__name__)

# A run's webhook still to be delivered reads the thread: its thread waits for it.
_NO_WEBHOOK_DUE = f"""NOT EXISTS (SELECT 1 FROM lg_webhooks w WHERE w.run_id = x.run_id
    AND w.delivered_at IS NULL AND w.attempts < {MAX_ATTEMPTS})"""
_DUE = f"""
SELECT x.thread_id FROM lg_thread_expiry x
WHERE (x.expires_at IS NOT NULL AND x.expires_at <= now())
   OR (x.run_id IS NOT NULL AND {_NO_WEBHOOK_DUE} AND EXISTS (
        SELECT 1 FROM runs r WHERE r.id = x.run_id AND {status_in(TERMINAL, "r.status")}
          AND COALESCE(r.finished_at, r.updated_at) <= now() - make_interval(secs => %s)))
   OR (x.run_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = x.run_id))
LIMIT %s
FOR UPDATE OF x SKIP LOCKED
"""


def ttl_minutes(ttl: Any) -> float | None:
    """Return the minutes of a thread's `ttl` as the SDK sends it (a number or a mapping).

    Raises:
        InvalidGraphRequestError: the strategy is not `delete`, or the minutes are not between
            one second and a year.
    """
    if ttl is None:
        return None
    if isinstance(ttl, dict):
        if (ttl.get("strategy") or "delete") != "delete":
            raise InvalidGraphRequestError("a thread's ttl strategy is 'delete'")
        ttl = ttl.get("ttl")
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise InvalidGraphRequestError("`ttl` is a number of minutes")
    if not MIN_TTL_MINUTES <= ttl <= MAX_TTL_MINUTES:
        raise InvalidGraphRequestError(
            "`ttl` must be between 1/60 (one second) and 527040 (a year) minutes"
        )
    return float(ttl)


async def set_ttl(conn: Conn, thread_id: str, minutes: float) -> None:
    """Make the thread expire `minutes` from now (and again that long after each read)."""
    await conn.execute(
        "INSERT INTO lg_thread_expiry (thread_id, ttl_minutes, expires_at)"
        " VALUES (%(t)s, %(m)s, now() + make_interval(secs => %(m)s * 60))"
        " ON CONFLICT (thread_id) DO UPDATE SET ttl_minutes = EXCLUDED.ttl_minutes,"
        " expires_at = EXCLUDED.expires_at",
        {"t": thread_id, "m": minutes},
    )


async def refresh_ttl(conn: Conn, thread_id: str) -> None:
    """Push a thread's expiry back by its `ttl` (a read of a thread refreshes it)."""
    await conn.execute(
        "UPDATE lg_thread_expiry SET expires_at = now() + make_interval(secs => ttl_minutes * 60)"
        " WHERE thread_id = %s AND ttl_minutes IS NOT NULL",
        (thread_id,),
    )


async def ttl_view(conn: Conn, thread_id: str) -> dict[str, Any] | None:
    """Return the thread's `ttl` as LangGraph shows it, or None."""
    cur = await conn.execute(
        "SELECT ttl_minutes, expires_at FROM lg_thread_expiry"
        " WHERE thread_id = %s AND ttl_minutes IS NOT NULL",
        (thread_id,),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    return {"strategy": "delete", "ttl": row["ttl_minutes"], "expires_at": row["expires_at"]}


async def delete_after_run(conn: Conn, thread_id: str, run_id: str) -> None:
    """Delete the thread once `run_id` has ended (in the transaction that creates the run)."""
    await conn.execute(
        "INSERT INTO lg_thread_expiry (thread_id, run_id) VALUES (%s, %s)"
        " ON CONFLICT (thread_id) DO UPDATE SET run_id = EXCLUDED.run_id,"
        " ttl_minutes = NULL, expires_at = NULL",
        (thread_id, run_id),
    )


async def _delete(conn: Conn, saver: BaseCheckpointSaver[Any] | None, thread_id: str) -> None:
    await conn.execute("DELETE FROM conversations WHERE id = %s", (thread_id,))
    if saver is not None:
        await saver.adelete_thread(thread_id)


async def delete_after_delivery(
    pool: Pool, saver: BaseCheckpointSaver[Any] | None, run_id: str
) -> bool:
    """Delete the thread of an ended run marked `on_completion: delete`; say if one went."""
    async with pool.connection() as conn, conn.transaction():
        cur = await conn.execute(
            "SELECT x.thread_id FROM lg_thread_expiry x JOIN runs r ON r.id = x.run_id"
            f" WHERE x.run_id = %s AND {status_in(TERMINAL, 'r.status')} AND {_NO_WEBHOOK_DUE}"
            " FOR UPDATE OF x SKIP LOCKED",
            (run_id,),
        )
        row = await cur.fetchone()
        if row is None:
            return False
        await _delete(conn, saver, row["thread_id"])
    return True


async def sweep_threads(
    pool: Pool, saver: BaseCheckpointSaver[Any] | None, grace_s: float, batch: int = 100
) -> int:
    """Delete due threads (not those with a run in progress); return how many went."""
    async with pool.connection() as conn, conn.transaction():
        cur = await conn.execute(_DUE, (grace_s, batch))
        due = [r["thread_id"] for r in await cur.fetchall()]
        gone = 0
        for thread_id in due:
            cur = await conn.execute(
                f"SELECT 1 FROM runs WHERE conversation_id = %s AND {status_in(IN_PROGRESS)}"
                " LIMIT 1",
                (thread_id,),
            )
            if await cur.fetchone() is not None:
                continue  # an expired thread still running is deleted when it is idle
            await _delete(conn, saver, thread_id)
            gone += 1
    if gone:
        log.info("deleted %d LangGraph threads past their ttl or run", gone)
    return gone
