"""Assistants created through the LangGraph API, with versions, beside each graph's default.

An assistant is a graph with a name, a `config`, a `context` and `metadata`; every update
stores a new version and makes it the one in use, and `latest` picks another. Runs take the
assistant's config and context under their own. For agentrt's own agent, `context.agent`
names the agent profile (`name` or `name@version`) its runs use, so an assistant is a view of
a profile. Each graph's default assistant is not stored and cannot be changed.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from server.auth import Principal
from server.db.pool import Conn, Pool
from server.errors import (
    AssistantExistsError,
    AssistantNotFoundError,
    AssistantReadOnlyError,
    UnknownReferenceError,
)
from server.langgraph_api.assistants import (
    assistant_view,
    resolve_assistant,
    resolve_named,
    search_assistants,
)
from server.langgraph_api.graphs import GraphEntry, GraphRegistry
from server.timestamps import iso

_CURRENT = (
    "SELECT a.assistant_id, a.graph_id, a.version, a.created_at, v.created_at AS updated_at,"
    " v.name, v.description, v.config, v.context, v.metadata FROM lg_assistants a"
    " JOIN lg_assistant_versions v ON v.assistant_id = a.assistant_id AND v.version = a.version"
)


def stored_view(row: dict[str, Any]) -> dict[str, Any]:
    """Return a stored assistant as LangGraph's `Assistant`."""
    return {
        "assistant_id": row["assistant_id"],
        "graph_id": row["graph_id"],
        "config": row["config"],
        "context": row["context"],
        "metadata": row["metadata"],
        "version": row["version"],
        "name": row["name"],
        "description": row["description"],
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
    }


def merged(base: dict[str, Any], override: dict[str, Any] | None) -> dict[str, Any]:
    """Merge `override` over `base`, one level into `configurable`."""
    out = {**base, **(override or {})}
    if "configurable" in base or "configurable" in (override or {}):
        inner = {**base.get("configurable", {}), **(override or {}).get("configurable", {})}
        out["configurable"] = inner
    return out


@dataclass(frozen=True)
class AssistantBook:
    """The tenant's assistants: each graph's default, and those created through the API."""

    pool: Pool
    graphs: GraphRegistry
    who: Principal

    async def _row(self, conn: Conn, assistant_id: str) -> dict[str, Any] | None:
        cur = await conn.execute(
            f"{_CURRENT} WHERE a.assistant_id = %s AND a.tenant_id = %s",
            (assistant_id, self.who.tenant_id),
        )
        return await cur.fetchone()

    async def get(self, assistant_id: str) -> tuple[dict[str, Any], GraphEntry]:
        """Return an assistant (by id, or a graph id for its default) and its graph.

        Raises:
            AssistantNotFoundError: no such assistant or graph.
        """
        async with self.pool.connection() as conn:
            row = await self._row(conn, assistant_id)
        if row is None:
            entry = resolve_assistant(self.graphs, assistant_id)
            return assistant_view(entry), entry
        entry = resolve_assistant(self.graphs, row["graph_id"])
        return stored_view(row), entry

    async def named(self, assistant_id: str) -> tuple[dict[str, Any], GraphEntry]:
        """`get` for an assistant a request body names (a run's, a cron's).

        Raises:
            UnknownReferenceError: no such assistant or graph.
        """
        try:
            return await self.get(assistant_id)
        except AssistantNotFoundError as exc:
            raise UnknownReferenceError(str(exc)) from exc

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create an assistant of `graph_id` (version 1).

        Raises:
            AssistantExistsError: `assistant_id` is taken and `if_exists` is not `do_nothing`.
        """
        entry = resolve_named(self.graphs, str(body.get("graph_id") or ""))
        assistant_id = str(body.get("assistant_id") or uuid.uuid4())
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "INSERT INTO lg_assistants (assistant_id, tenant_id, graph_id) VALUES (%s, %s, %s)"
                " ON CONFLICT (assistant_id) DO NOTHING RETURNING assistant_id",
                (assistant_id, self.who.tenant_id, entry.graph_id),
            )
            if await cur.fetchone() is None:
                if body.get("if_exists") != "do_nothing":
                    raise AssistantExistsError(assistant_id)
            else:
                await self._add_version(conn, assistant_id, 1, entry.graph_id, body, {})
        return (await self.get(assistant_id))[0]

    async def _add_version(
        self,
        conn: Conn,
        assistant_id: str,
        version: int,
        graph_id: str,
        body: dict[str, Any],
        before: dict[str, Any],
    ) -> None:
        def pick(key: str, default: Any) -> Any:
            return body[key] if body.get(key) is not None else before.get(key, default)

        await conn.execute(
            "INSERT INTO lg_assistant_versions (assistant_id, version, graph_id, name,"
            " description, config, context, metadata) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (
                assistant_id,
                version,
                graph_id,
                pick("name", graph_id),
                pick("description", None),
                Jsonb(pick("config", {})),
                Jsonb(pick("context", {})),
                Jsonb(pick("metadata", {})),
            ),
        )

    async def _locked(self, conn: Conn, assistant_id: str) -> dict[str, Any]:
        cur = await conn.execute(
            "SELECT * FROM lg_assistants WHERE assistant_id = %s AND tenant_id = %s FOR UPDATE",
            (assistant_id, self.who.tenant_id),
        )
        found = await cur.fetchone()
        if found is None:
            resolve_assistant(self.graphs, assistant_id)  # 404 unless it is a default one
            raise AssistantReadOnlyError(assistant_id)
        return found

    async def update(self, assistant_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Store a new version from the fields given (the rest as in use) and use it."""
        async with self.pool.connection() as conn, conn.transaction():
            await self._locked(conn, assistant_id)
            current = await self._row(conn, assistant_id)
            assert current is not None
            graph_id = str(body.get("graph_id") or current["graph_id"])
            resolve_named(self.graphs, graph_id)
            cur = await conn.execute(
                "SELECT max(version) AS v FROM lg_assistant_versions WHERE assistant_id = %s",
                (assistant_id,),
            )
            top = await cur.fetchone()
            version = int(top["v"] if top else 0) + 1
            await self._add_version(conn, assistant_id, version, graph_id, body, current)
            await conn.execute(
                "UPDATE lg_assistants SET version = %s, graph_id = %s, updated_at = now()"
                " WHERE assistant_id = %s",
                (version, graph_id, assistant_id),
            )
        return (await self.get(assistant_id))[0]

    async def set_latest(self, assistant_id: str, version: int) -> dict[str, Any]:
        """Use an earlier (or later) version of the assistant."""
        async with self.pool.connection() as conn, conn.transaction():
            await self._locked(conn, assistant_id)
            cur = await conn.execute(
                "UPDATE lg_assistants a SET version = v.version, graph_id = v.graph_id,"
                " updated_at = now() FROM lg_assistant_versions v WHERE a.assistant_id = %s"
                " AND v.assistant_id = a.assistant_id AND v.version = %s RETURNING a.version",
                (assistant_id, version),
            )
            if await cur.fetchone() is None:
                raise UnknownReferenceError(
                    f"assistant {assistant_id} has no version {version}; POST"
                    f" /assistants/{assistant_id}/versions lists them"
                )
        return (await self.get(assistant_id))[0]

    async def delete(self, assistant_id: str) -> None:
        """Delete an assistant, its versions and its crons (runs that used it are kept).

        A cron of a deleted assistant could only fail at every due time: as in LangGraph's
        server, the crons go with their assistant.
        """
        async with self.pool.connection() as conn, conn.transaction():
            await self._locked(conn, assistant_id)
            await conn.execute("DELETE FROM lg_assistants WHERE assistant_id = %s", (assistant_id,))
            await conn.execute(
                "DELETE FROM lg_crons WHERE tenant_id = %s AND assistant_id = %s",
                (self.who.tenant_id, assistant_id),
            )

    async def versions(self, assistant_id: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """List an assistant's versions, newest first (`metadata`, `limit`, `offset`)."""
        async with self.pool.connection() as conn:
            row = await self._row(conn, assistant_id)
            if row is None:
                view, _ = await self.get(assistant_id)
                return [view]
            cur = await conn.execute(
                "SELECT v.*, v.created_at AS updated_at FROM lg_assistant_versions v"
                " WHERE v.assistant_id = %s AND v.metadata @> %s ORDER BY v.version DESC"
                " LIMIT %s OFFSET %s",
                (
                    assistant_id,
                    Jsonb(body.get("metadata") or {}),
                    int(body.get("limit") or 10),
                    int(body.get("offset") or 0),
                ),
            )
            return [stored_view(r) for r in await cur.fetchall()]

    async def search(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """Return the defaults and the stored assistants matching `graph_id`, `name`, `metadata`."""
        found = search_assistants(self.graphs, body)
        where, args = (
            "a.tenant_id = %s AND v.metadata @> %s",
            [
                self.who.tenant_id,
                Jsonb(body.get("metadata") or {}),
            ],
        )
        if body.get("graph_id"):
            where += " AND a.graph_id = %s"
            args.append(str(body["graph_id"]))
        if body.get("name"):
            where += " AND v.name ILIKE %s"
            args.append(f"%{body['name']}%")
        async with self.pool.connection() as conn:
            cur = await conn.execute(f"{_CURRENT} WHERE {where} ORDER BY a.created_at", args)
            found += [stored_view(r) for r in await cur.fetchall()]
        return found
