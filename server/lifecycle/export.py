"""Export of a conversation as JSON lines, streamed from a server-side cursor.

Memory stays flat however long the conversation: rows are read in batches of `_BATCH` from
one snapshot (a repeatable-read transaction) and written out as they come.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row

from server.auth import Principal
from server.db.pool import Conn, Pool
from server.domain import Run
from server.events.log import EVENT_DATA, encode_event
from server.runs.conversations import get_conversation
from server.runs.views import conversation_view, message_view, run_view
from server.usage.ledger import call_view

_BATCH = 1000


@dataclass(frozen=True)
class Section:
    """One kind of line: the rows of a conversation it comes from, and how a row reads.

    Attributes:
        kind: The line's `kind`.
        sql: A query with `%(conversation)s` and `%(tenant)s`, in export order.
        render: The line's JSON text from a row.
    """

    kind: str
    sql: str
    render: Callable[[dict[str, Any]], str]


def _line(kind: str, body: dict[str, Any]) -> str:
    return json.dumps({"kind": kind, **body}, default=str, separators=(",", ":"))


def _event(row: dict[str, Any]) -> str:
    wire = encode_event(row["run_id"], row["seq"], row["type"], row["ts"], row["data"])
    return f'{{"kind":"event","event":{wire}}}'


def _artifact_link(row: dict[str, Any]) -> dict[str, Any]:
    """A version of an artifact: its record and where its content is, not the content."""
    return {
        "artifactId": row["id"],
        "name": row["name"],
        "version": row["version"],
        "runId": row["run_id"],
        "mediaType": row["media_type"],
        "size": row["size"],
        "checksum": row["checksum"],
        "createdAt": row["created_at"],
        "link": f"/api/artifacts/{row['id']}/content?version={row['version']}",
    }


SECTIONS: tuple[Section, ...] = (
    Section(
        "message",
        "SELECT * FROM messages WHERE conversation_id = %(conversation)s ORDER BY position",
        lambda r: _line("message", message_view(r)),
    ),
    Section(
        "run",
        "SELECT * FROM runs WHERE conversation_id = %(conversation)s AND tenant_id = %(tenant)s"
        " ORDER BY created_at, id",
        lambda r: _line("run", run_view(Run.from_row(r))),
    ),
    Section(
        "event",
        f"SELECT e.run_id, e.seq, e.type, e.ts, ({EVENT_DATA})::text AS data FROM runs r"
        " JOIN run_events e ON e.run_id = r.id AND e.ts >= r.created_at - interval '1 day'"
        " AND e.ts <= r.updated_at + interval '1 day'"
        " WHERE r.conversation_id = %(conversation)s AND r.tenant_id = %(tenant)s"
        " ORDER BY r.created_at, r.id, e.seq",
        _event,
    ),
    Section(
        "usage",
        "SELECT m.* FROM model_calls m JOIN runs r ON r.id = m.run_id"
        " WHERE r.conversation_id = %(conversation)s AND r.tenant_id = %(tenant)s"
        " ORDER BY m.created_at, m.id",
        lambda r: _line("usage", call_view(r)),
    ),
    Section(
        "artifact",
        "SELECT a.id, a.name, v.version, v.run_id, v.media_type,"
        " v.size, v.checksum, v.created_at FROM artifacts a"
        " JOIN artifact_versions v ON v.artifact_id = a.id AND v.status = 'ready'"
        " WHERE a.conversation_id = %(conversation)s AND a.tenant_id = %(tenant)s"
        " ORDER BY a.created_at, a.id, v.version",
        lambda r: _line("artifact", _artifact_link(r)),
    ),
)
"""What an export holds, in order. A feature with rows of a conversation adds its section
here; artifacts are links (their content is served by the artifacts API)."""


async def open_export(pool: Pool, who: Principal, conversation_id: str) -> dict[str, Any]:
    """Check the caller may export the conversation and return it.

    Raises:
        ConversationNotFoundError: no such conversation in the caller's tenant.
    """
    async with pool.connection() as conn:
        return await get_conversation(conn, who, conversation_id)


async def _rows(conn: Conn, sql: str, params: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    async with conn.cursor(name="agentrt_export", row_factory=dict_row) as cur:
        cur.itersize = _BATCH
        await cur.execute(sql, params)
        async for row in cur:
            yield row


async def export_lines(
    pool: Pool, who: Principal, conversation: dict[str, Any]
) -> AsyncIterator[bytes]:
    """Yield the conversation as JSON lines: itself, then each section's rows in order."""
    yield (_line("conversation", conversation_view(conversation)) + "\n").encode()
    params = {"conversation": conversation["id"], "tenant": who.tenant_id}
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        for section in SECTIONS:
            chunk: list[str] = []
            async for row in _rows(conn, section.sql, params):
                chunk.append(section.render(row))
                if len(chunk) >= _BATCH:
                    yield ("\n".join(chunk) + "\n").encode()
                    chunk = []
            if chunk:
                yield ("\n".join(chunk) + "\n").encode()
