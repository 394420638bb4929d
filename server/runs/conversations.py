"""Conversations and their messages: every query scoped by the caller's tenant."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from psycopg.types.json import Jsonb

from server.agents.store import resolve_agent
from server.auth import Principal
from server.db.pool import Conn, Pool
from server.errors import ConversationNotFoundError
from server.ids import new_id


async def create_conversation(
    pool: Pool,
    who: Principal,
    title: str | None,
    model: str | None,
    metadata: dict[str, Any],
    agent: str | None = None,
) -> dict[str, Any]:
    """Create a conversation owned by the caller; `agent` names the profile its runs use.

    Raises:
        UnknownAgentError: `agent` names no profile of the caller's tenant.
    """
    async with pool.connection() as conn:
        if agent is not None:
            await resolve_agent(conn, who.tenant_id, agent)
        cur = await conn.execute(
            "INSERT INTO conversations (id, tenant_id, user_id, title, model, metadata, agent)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING *",
            (new_id("conv"), who.tenant_id, who.user_id, title, model, Jsonb(metadata), agent),
        )
        row = await cur.fetchone()
    assert row is not None
    return row


async def get_conversation(
    conn: Conn,
    who: Principal,
    conversation_id: str,
    *,
    lock: bool = False,
    alongside: Callable[[Conn], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Return the tenant's conversation (locked if `lock`), or raise ConversationNotFoundError.

    The lock is `FOR NO KEY UPDATE`, which lets a worker insert rows that reference the
    conversation (the assistant message) meanwhile; `FOR UPDATE` would block those inserts'
    foreign-key checks while we wait for that worker's run row: a deadlock.

    `alongside` runs its statements after the conversation's: on a pipelined connection both
    go out in one round trip. It keeps its own errors for later, so that a missing
    conversation is what the caller hears of first.
    """
    cur = await conn.execute(
        "SELECT * FROM conversations WHERE id = %s AND tenant_id = %s"
        + (" FOR NO KEY UPDATE" if lock else ""),
        (conversation_id, who.tenant_id),
    )
    if alongside is not None:
        await alongside(conn)
    row = await cur.fetchone()
    if row is None:
        raise ConversationNotFoundError(conversation_id)
    return row


async def list_messages(pool: Pool, who: Principal, conversation_id: str) -> list[dict[str, Any]]:
    """List a conversation's stored messages in order."""
    async with pool.connection() as conn:
        await get_conversation(conn, who, conversation_id)
        cur = await conn.execute(
            "SELECT * FROM messages WHERE conversation_id = %s ORDER BY position",
            (conversation_id,),
        )
        return await cur.fetchall()
