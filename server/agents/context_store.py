"""Where the context engine's records live: summaries and the manifests of model calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodes.context.summary import Summary
from server.db.pool import Conn, Pool
from server.events.manifests import stored


@dataclass(frozen=True)
class PostgresSummaryStore:
    """A tenant's conversation summaries, keyed by the number of messages they cover."""

    pool: Pool
    tenant_id: str

    async def latest(self, conversation_id: str) -> Summary | None:
        """Return the summary covering the most messages, if any."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT * FROM context_summaries WHERE conversation_id = %s AND tenant_id = %s"
                " ORDER BY covers DESC LIMIT 1",
                (conversation_id, self.tenant_id),
            )
            row = await cur.fetchone()
        if row is None:
            return None
        return Summary(
            row["text"],
            row["covers"],
            row["first_message_id"],
            row["last_message_id"],
            row["tokens"],
            row["model"],
        )

    async def save(self, conversation_id: str, run_id: str, summary: Summary) -> None:
        """Store a summary; a second one for the same range keeps the first."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO context_summaries (conversation_id, covers, tenant_id, run_id,"
                " first_message_id, last_message_id, text, tokens, model)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (conversation_id, covers) DO NOTHING",
                (
                    conversation_id,
                    summary.covers,
                    self.tenant_id,
                    run_id,
                    summary.first_message_id,
                    summary.last_message_id,
                    summary.text,
                    summary.tokens,
                    summary.model,
                ),
            )


async def run_manifests(
    conn: Conn, run_id: str, step: int | None = None, attempt: int | None = None
) -> list[dict[str, Any]]:
    """Return a run's context manifests in (step, attempt) order, optionally filtered.

    A step built twice in one attempt (run again) has the latest manifest returned.
    """
    cur = await conn.execute(
        "SELECT DISTINCT ON (step, attempt) step, attempt, event_seq, created_at,"
        f" {stored()} AS manifest FROM context_manifests WHERE run_id = %s"
        " AND (%s::int IS NULL OR step = %s) AND (%s::int IS NULL OR attempt = %s)"
        " ORDER BY step, attempt, event_seq DESC",
        (run_id, step, step, attempt, attempt),
    )
    return [
        {
            **row["manifest"],
            "step": row["step"],
            "attempt": row["attempt"],
            "eventId": row["event_seq"],
            "createdAt": row["created_at"].isoformat(),
        }
        for row in await cur.fetchall()
    ]
