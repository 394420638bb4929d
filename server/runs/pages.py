"""Keyset pages of conversations and runs, newest first, scoped by the caller's tenant.

A cursor is the id of the last row of the previous page: ids are unique and the rows sort by
`(created_at, id)`, so a page never repeats or skips a row while new rows arrive.
"""

from __future__ import annotations

from typing import Any

from server.auth import Principal
from server.db.pool import Pool
from server.domain import Run
from server.errors import BadCursorError
from server.runs.conversations import get_conversation


async def _page(
    pool: Pool,
    table: str,
    where: str,
    params: tuple[Any, ...],
    cursor: str | None,
    limit: int,
) -> tuple[list[dict[str, Any]], str | None]:
    # `table` and `where` are constants of this module, never caller input.
    async with pool.connection() as conn:
        after = ""
        if cursor:  # an empty cursor is the first page, as none is
            cur = await conn.execute(
                f"SELECT created_at, id FROM {table} WHERE id = %s AND {where}",
                (cursor, *params),
            )
            mark = await cur.fetchone()
            if mark is None:
                raise BadCursorError(cursor)
            after = " AND (created_at, id) < (%s, %s)"
            params = (*params, mark["created_at"], mark["id"])
        cur = await conn.execute(
            f"SELECT * FROM {table} WHERE {where}{after}"
            " ORDER BY created_at DESC, id DESC LIMIT %s",
            (*params, limit + 1),
        )
        rows = await cur.fetchall()
    if len(rows) > limit:
        return rows[:limit], rows[limit - 1]["id"]
    return rows, None


async def conversations_page(
    pool: Pool, who: Principal, cursor: str | None, limit: int
) -> tuple[list[dict[str, Any]], str | None]:
    """Return a page of the tenant's conversations and the cursor of the next page."""
    return await _page(pool, "conversations", "tenant_id = %s", (who.tenant_id,), cursor, limit)


async def runs_page(
    pool: Pool, who: Principal, conversation_id: str | None, cursor: str | None, limit: int
) -> tuple[list[Run], str | None]:
    """Return a page of the tenant's runs (of one conversation if given) and the next cursor.

    Raises:
        ConversationNotFoundError: no such conversation for this tenant.
    """
    where, params = "tenant_id = %s", [who.tenant_id]
    if conversation_id is not None:
        async with pool.connection() as conn:
            await get_conversation(conn, who, conversation_id)
        where, params = "tenant_id = %s AND conversation_id = %s", [who.tenant_id, conversation_id]
    rows, next_cursor = await _page(pool, "runs", where, tuple(params), cursor, limit)
    return [Run.from_row(r) for r in rows], next_cursor
