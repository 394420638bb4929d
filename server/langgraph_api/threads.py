"""Threads of the LangGraph API: agentrt conversations, their checkpoints and their state.

A thread is a conversation (same id, tenant, owner and metadata); its state is the graph's
checkpoint on that thread id. The graph that reads a thread's state is the one its latest
run used (`graph_id` in the thread's metadata, as LangGraph records it).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.errors import InvalidUpdateError
from langgraph.pregel import Pregel
from langgraph.types import StateSnapshot, StateUpdate
from psycopg.types.json import Jsonb

from server.auth import Principal
from server.db.pool import Conn, Pool
from server.domain import IN_PROGRESS, status_in
from server.errors import (
    InvalidGraphRequestError,
    LangGraphItemNotFoundError,
    ThreadExistsError,
    ThreadNotFoundError,
    UnknownReferenceError,
)
from server.langgraph_api.auth import Filters, metadata_sql
from server.langgraph_api.expiry import refresh_ttl, set_ttl, ttl_minutes, ttl_view
from server.langgraph_api.graphs import GraphRegistry
from server.langgraph_api.serde import to_json
from server.timestamps import iso


@dataclass(frozen=True)
class ThreadKeeper:
    """Threads of one caller: rows in `conversations`, state in the checkpointer."""

    pool: Pool
    graphs: GraphRegistry
    who: Principal
    # Metadata filters from langgraph.json's auth handlers (server/langgraph_api/auth.py).
    filters: Filters = field(default_factory=dict)
    # The tenant's visibility setting: `tenant` shows every user the tenant's threads.
    visibility: str = "owner"

    def _owned(self) -> tuple[str, list[Any]]:
        """Return the SQL filter of the caller's threads.

        A tenant admin, or anyone of a tenant whose threads are visible tenant-wide, sees the
        tenant's threads; anyone else only their own.
        """
        where, args = "c.tenant_id = %s", [self.who.tenant_id]
        if not self.who.has_role("admin") and self.visibility != "tenant":
            where, args = f"{where} AND c.user_id = %s", [*args, self.who.user_id]
        extra, more = metadata_sql(self.filters, "c.metadata")
        return (f"{where} AND {extra}", [*args, *more]) if extra else (where, args)

    async def row(self, conn: Conn, thread_id: str, *, lock: bool = False) -> dict[str, Any]:
        """Return the thread's conversation row, or raise ThreadNotFoundError."""
        where, args = self._owned()
        cur = await conn.execute(
            f"SELECT c.* FROM conversations c WHERE c.id = %s AND {where}"
            + (" FOR NO KEY UPDATE" if lock else ""),
            (thread_id, *args),
        )
        found = await cur.fetchone()
        if found is None:
            raise ThreadNotFoundError(thread_id)
        await refresh_ttl(conn, thread_id)
        return found

    async def create(
        self,
        thread_id: str | None,
        metadata: dict[str, Any],
        if_exists: str = "raise",
        ttl: Any = None,
        *,
        expires_in_s: float | None = None,
    ) -> dict[str, Any]:
        """Create a thread (a conversation owned by the caller) and return its view.

        Args:
            thread_id: Its id; None makes one.
            metadata: Its metadata.
            if_exists: `raise` or `do_nothing` when `thread_id` exists.
            ttl: Its `ttl` as the SDK sends it (minutes, or `{"ttl", "strategy"}`).
            expires_in_s: Delete it after this long unless a run takes it over (a stateless
                run's thread, until the run that deletes it on completion exists).

        Raises:
            ThreadExistsError: `thread_id` exists and `if_exists` is not `do_nothing`.
        """
        thread_id = thread_id or str(uuid.uuid4())
        minutes = ttl_minutes(ttl)
        if expires_in_s is not None:
            minutes = expires_in_s / 60
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "INSERT INTO conversations (id, tenant_id, user_id, metadata)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO NOTHING RETURNING id",
                (thread_id, self.who.tenant_id, self.who.user_id, Jsonb(metadata)),
            )
            if await cur.fetchone() is None:
                if if_exists != "do_nothing":
                    raise ThreadExistsError(thread_id)
            elif minutes is not None:
                await set_ttl(conn, thread_id, minutes)
        return await self.get(thread_id)

    async def get(self, thread_id: str) -> dict[str, Any]:
        """Return the thread as LangGraph shows it: metadata, status, values, interrupts."""
        async with self.pool.connection() as conn:
            row = await self.row(conn, thread_id)
            status, updated = await self._status(conn, thread_id)
        state = await self.state(thread_id, row=row)
        if status == "idle" and state is not None and state.interrupts:
            status = "interrupted"
        return {
            "thread_id": thread_id,
            "created_at": iso(row["created_at"]),
            "updated_at": iso(updated or row["created_at"]),
            "metadata": row["metadata"] or {},
            "status": status,
            "values": to_json(state.values) if state is not None else None,
            "interrupts": _interrupts(state),
        }

    async def _status(self, conn: Conn, thread_id: str) -> tuple[str, Any]:
        cur = await conn.execute(
            f"SELECT bool_or({status_in(IN_PROGRESS)}) AS busy, max(updated_at) AS updated,"
            " (array_agg(status ORDER BY created_at DESC, id DESC))[1] AS last"
            " FROM runs WHERE conversation_id = %s",
            (thread_id,),
        )
        found = await cur.fetchone()
        assert found is not None
        if found["busy"]:
            return "busy", found["updated"]
        return ("error" if found["last"] == "failed" else "idle"), found["updated"]

    async def update(
        self, thread_id: str, metadata: dict[str, Any], ttl: Any = None
    ) -> dict[str, Any]:
        """Merge `metadata` into the thread's; a `ttl` replaces its expiry."""
        minutes = ttl_minutes(ttl)
        async with self.pool.connection() as conn, conn.transaction():
            await self.row(conn, thread_id)
            await conn.execute(
                "UPDATE conversations SET metadata = metadata || %s WHERE id = %s",
                (Jsonb(metadata), thread_id),
            )
            if minutes is not None:
                await set_ttl(conn, thread_id, minutes)
        return await self.get(thread_id)

    async def ttl(self, thread_id: str) -> dict[str, Any] | None:
        """Return the thread's `ttl` (`strategy`, `ttl` minutes, `expires_at`), or None."""
        async with self.pool.connection() as conn:
            await self.row(conn, thread_id)
            found = await ttl_view(conn, thread_id)
        if found is not None:
            found["expires_at"] = iso(found["expires_at"])
        return found

    async def delete(self, thread_id: str) -> None:
        """Delete the thread, its runs, their events and its checkpoints."""
        async with self.pool.connection() as conn:
            await self.row(conn, thread_id)
            await conn.execute("DELETE FROM conversations WHERE id = %s", (thread_id,))
        if self.graphs.checkpointer is not None:
            await self.graphs.checkpointer.adelete_thread(thread_id)

    async def prune(self, thread_ids: list[str], strategy: str) -> dict[str, int]:
        """Delete the threads (`delete`) or all but their latest checkpoint (`keep_latest`)."""
        if strategy not in ("delete", "keep_latest"):
            raise InvalidGraphRequestError("strategy is 'delete' or 'keep_latest'")
        mine = []
        async with self.pool.connection() as conn:
            for thread_id in thread_ids:
                try:
                    await self.row(conn, thread_id)
                except ThreadNotFoundError:
                    continue
                mine.append(thread_id)
        if strategy == "delete":
            for thread_id in mine:
                await self.delete(thread_id)
        elif mine and self.graphs.checkpointer is not None:
            await self.graphs.checkpointer.aprune(mine, strategy="keep_latest")
        return {"pruned_count": len(mine)}

    async def search(self, body: dict[str, Any], *, count: bool = False) -> Any:
        """Return the caller's threads matching `metadata`, `ids` and `status` (or their count)."""
        where, args = self._owned()
        if body.get("metadata"):
            where += " AND c.metadata @> %s"
            args.append(Jsonb(body["metadata"]))
        if body.get("ids"):
            where += " AND c.id = ANY(%s)"
            args.append(list(body["ids"]))
        sort = {"thread_id": "c.id", "created_at": "c.created_at"}.get(
            body.get("sort_by") or "created_at", "c.created_at"
        )
        order = "ASC" if (body.get("sort_order") or "desc").lower() == "asc" else "DESC"
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT c.id FROM conversations c WHERE {where} ORDER BY {sort} {order}, c.id",
                args,
            )
            ids = [r["id"] for r in await cur.fetchall()]
        found = [await self.get(i) for i in ids] if body.get("status") or not count else ids
        if body.get("status"):
            found = [t for t in found if t["status"] == body["status"]]
        if count:
            return len(found)
        offset, limit = int(body.get("offset") or 0), int(body.get("limit") or 10)
        return found[offset : offset + limit]

    async def graph_of(self, thread_id: str, row: dict[str, Any] | None = None) -> Pregel[Any]:
        """Return the compiled graph whose state the thread holds (its latest run's)."""
        if row is None:
            async with self.pool.connection() as conn:
                row = await self.row(conn, thread_id)
        graph_id = (row["metadata"] or {}).get("graph_id") or "agent"
        entry = self.graphs.get(graph_id) or self.graphs.get("agent")
        if entry is None:
            raise InvalidGraphRequestError(f"thread {thread_id} names no loaded graph")
        return await self.graphs.compiled(entry, {"configurable": {"thread_id": thread_id}})

    async def state(
        self,
        thread_id: str,
        checkpoint: dict[str, Any] | None = None,
        *,
        subgraphs: bool = False,
        row: dict[str, Any] | None = None,
    ) -> StateSnapshot | None:
        """Return the thread's state (at `checkpoint` when given); None before any run."""
        graph = await self.graph_of(thread_id, row)
        config = thread_config(thread_id, checkpoint)
        state = await graph.aget_state(config, subgraphs=subgraphs)
        if state.config is None or not state.created_at:
            if checkpoint and checkpoint.get("checkpoint_id"):
                raise LangGraphItemNotFoundError(
                    f"thread {thread_id} has no checkpoint {checkpoint['checkpoint_id']!r}"
                    f" in namespace {checkpoint.get('checkpoint_ns') or ''!r}; GET"
                    f" /threads/{thread_id}/history lists its checkpoints"
                )
            return None
        return state

    async def state_after(self, thread_id: str, run_id: str) -> StateSnapshot | None:
        """Return the thread's state as the run left it: its newest checkpoint by that run.

        A later run on the thread (a cron's next firing, a queued run) may already have moved
        the thread on; a thread with no checkpoint by the run (a run that ended before its
        first step) answers its current state.
        """
        async with self.pool.connection() as conn:
            row = await self.row(conn, thread_id)
        current = await self.state(thread_id, row=row)
        if current is None or (current.metadata or {}).get("run_id") == run_id:
            return current
        graph = await self.graph_of(thread_id, row)
        async for state in graph.aget_state_history(
            thread_config(thread_id, None), filter={"run_id": run_id}, limit=1
        ):
            return state
        return current

    async def history(self, thread_id: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """Return the thread's states, newest first (`limit`, `before`, `metadata`)."""
        graph = await self.graph_of(thread_id)
        before = body.get("before")
        if isinstance(before, str):
            before = {"checkpoint_id": before}
        states = []
        async for state in graph.aget_state_history(
            thread_config(thread_id, body.get("checkpoint")),
            filter=body.get("metadata") or None,
            before=thread_config(thread_id, before) if before else None,
            limit=int(body.get("limit") or 10),
        ):
            states.append(state_view(state))
        return states

    async def update_state(self, thread_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Write `values` as if node `as_node` returned them; return the new checkpoint."""
        graph = await self.graph_of(thread_id)
        checkpoint = body.get("checkpoint") or (
            {"checkpoint_id": body["checkpoint_id"]} if body.get("checkpoint_id") else None
        )
        try:
            config = await graph.aupdate_state(
                thread_config(thread_id, checkpoint),
                body.get("values"),
                as_node=body.get("as_node"),
            )
        except InvalidUpdateError as exc:  # e.g. `as_node` names no node of the graph
            raise InvalidGraphRequestError(f"cannot update the thread's state: {exc}") from exc
        except ValueError as exc:
            # LangGraph's answer to a `checkpoint_ns` that names no subgraph of the graph.
            if not (checkpoint or {}).get("checkpoint_ns") or not str(exc).startswith("Subgraph"):
                raise
            raise UnknownReferenceError(
                f"cannot update the thread's state: {exc} (checkpoint_ns names no subgraph of"
                f" graph {graph.name!r})"
            ) from exc
        return {"checkpoint": config["configurable"]}

    async def apply_supersteps(self, thread_id: str, supersteps: list[Any]) -> dict[str, Any]:
        """Write `supersteps` (each a list of `values`/`as_node` updates) to a new thread.

        A thread whose supersteps cannot be applied is deleted again.

        Raises:
            InvalidGraphRequestError: an update sends a `command`, or names no node.
        """
        try:
            steps = [[_update(u) for u in step.get("updates") or []] for step in supersteps]
            graph = await self.graph_of(thread_id)
            await graph.abulk_update_state(thread_config(thread_id), steps)
        except (InvalidUpdateError, InvalidGraphRequestError) as exc:
            await self.delete(thread_id)  # the create fails whole
            raise InvalidGraphRequestError(f"cannot apply the supersteps: {exc}") from exc
        return await self.get(thread_id)

    async def copy(self, thread_id: str) -> dict[str, Any]:
        """Copy the thread (metadata and every checkpoint) to a new thread id."""
        async with self.pool.connection() as conn:
            row = await self.row(conn, thread_id)
        new = await self.create(None, dict(row["metadata"] or {}))
        saver = self.graphs.checkpointer
        if saver is not None:
            tuples = [t async for t in saver.alist(thread_config(thread_id))]
            for found in reversed(tuples):
                target = thread_config(new["thread_id"])
                target["configurable"]["checkpoint_ns"] = found.config["configurable"].get(
                    "checkpoint_ns", ""
                )
                if found.parent_config is not None:
                    target["configurable"]["checkpoint_id"] = found.parent_config["configurable"][
                        "checkpoint_id"
                    ]
                stored = await saver.aput(
                    target, found.checkpoint, found.metadata, found.checkpoint["channel_versions"]
                )
                for task_id in {w[0] for w in found.pending_writes or []}:
                    mine = [(c, v) for t, c, v in found.pending_writes or [] if t == task_id]
                    await saver.aput_writes(stored, mine, task_id)
        return await self.get(new["thread_id"])


def _update(update: dict[str, Any]) -> StateUpdate:
    if update.get("command") is not None:
        raise InvalidGraphRequestError("a superstep update with a `command` is not served")
    return StateUpdate(update.get("values"), update.get("as_node"))


def thread_config(thread_id: str, checkpoint: dict[str, Any] | None = None) -> RunnableConfig:
    """Return the config that reads `thread_id` (at `checkpoint` when given)."""
    configurable: dict[str, Any] = {"thread_id": thread_id}
    for key, value in (checkpoint or {}).items():
        if key != "thread_id" and value is not None:
            configurable[key] = value
    return {"configurable": configurable}


def _interrupts(state: StateSnapshot | None) -> dict[str, Any]:
    """LangGraph's thread `interrupts`: each pending interrupt under its task id."""
    found: dict[str, Any] = {}
    for task in state.tasks if state is not None else ():
        if task.interrupts:
            found[task.id] = to_json(list(task.interrupts))
    return found


def state_view(state: StateSnapshot) -> dict[str, Any]:
    """Return a state as LangGraph's `ThreadState`."""
    parent = state.parent_config["configurable"] if state.parent_config else None
    return {
        "values": to_json(state.values),
        "next": list(state.next),
        "checkpoint": to_json((state.config or {}).get("configurable", {})),
        "metadata": to_json(state.metadata or {}),
        "created_at": state.created_at,
        "parent_checkpoint": to_json(parent),
        "tasks": [
            {
                "id": t.id,
                "name": t.name,
                "path": to_json(t.path),
                "error": str(t.error) if t.error else None,
                "interrupts": to_json(list(t.interrupts)),
                "checkpoint": to_json(t.state["configurable"])
                if isinstance(t.state, dict)
                else None,
                "state": state_view(t.state) if isinstance(t.state, StateSnapshot) else None,
                "result": to_json(t.result),
            }
            for t in state.tasks
        ],
        "interrupts": to_json(list(state.interrupts)),
    }
