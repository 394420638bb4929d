"""What the LangGraph API's routes ask for, bound to one caller and this process's parts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from langgraph.store.base import BaseStore

from server import jsontext
from server.auth import Principal
from server.db.pool import Pool
from server.domain import parse_seq
from server.errors import MemoryUnavailableError
from server.events.notify import Notifier
from server.langgraph_api.assistant_book import AssistantBook
from server.langgraph_api.auth import AuthUser, Filters, GraphAuth
from server.langgraph_api.crons import CronBook
from server.langgraph_api.expiry import delete_after_delivery
from server.langgraph_api.graphs import GraphRegistry
from server.langgraph_api.parts import stored_modes
from server.langgraph_api.runs import LangGraphRuns
from server.langgraph_api.store import StoreGate
from server.langgraph_api.stream import graph_stream
from server.langgraph_api.thread_stream import parse_cursor, thread_modes, thread_stream
from server.langgraph_api.threads import ThreadKeeper
from server.settings import Settings


@dataclass(frozen=True)
class LangGraphService:
    """The LangGraph API's threads, runs, streams and store for one caller."""

    pool: Pool
    graphs: GraphRegistry
    notifier: Notifier
    settings: Settings
    who: Principal
    stopping: asyncio.Event
    store_: BaseStore | None = None
    # langgraph.json's auth handlers and the user they named; None with agentrt's API keys.
    guard: GraphAuth | None = None
    user: AuthUser | None = None

    async def authorize(
        self, resource: str, action: str, value: dict[str, Any] | None = None
    ) -> Filters:
        """Ask the auth handler of `resource`.`action` (it may change `value`); return filters."""
        if self.guard is None or self.user is None:
            return {}
        return await self.guard.authorize(self.user, resource, action, value or {})

    async def assistants(self, action: str, value: dict[str, Any] | None = None) -> AssistantBook:
        """The tenant's assistants, once the handler of `assistants`.`action` allows it."""
        await self.authorize("assistants", action, value)
        return AssistantBook(self.pool, self.graphs, self.who)

    async def threads(self, action: str, value: dict[str, Any] | None = None) -> ThreadKeeper:
        """The caller's threads, as the auth handler of `threads`.`action` lets it see them."""
        filters = await self.authorize("threads", action, value)
        visibility = self.settings.langgraph_thread_visibility.get(self.who.tenant_id, "owner")
        return ThreadKeeper(self.pool, self.graphs, self.who, filters, visibility)

    async def runs(self, action: str, value: dict[str, Any] | None = None) -> LangGraphRuns:
        """The caller's runs; their threads pass the handler of `threads`.`action`."""
        filters = await self.authorize("threads", action, value)
        return LangGraphRuns(
            self.pool, self.graphs, self.notifier, self.settings, self.who, filters
        )

    async def crons(self, action: str, value: dict[str, Any] | None = None) -> CronBook:
        """The caller's crons, once the handler of `crons`.`action` allows it."""
        await self.authorize("crons", action, value)
        return CronBook(self.pool, self.graphs, self.who)

    async def store(self, action: str, value: dict[str, Any] | None = None) -> StoreGate:
        """The store as the caller may use it, once the handler of `store`.`action` allows it.

        Raises:
            MemoryUnavailableError: this process runs without a store.
        """
        if self.store_ is None:
            raise MemoryUnavailableError("this server has no store")
        await self.authorize("store", action, value)
        return StoreGate(self.store_, self.who)

    async def stream(
        self,
        run_id: str,
        *,
        last_event_id: str | None,
        modes: Sequence[str] | None = None,
        thread_id: str | None = None,
    ) -> AsyncIterator[str]:
        """Return the run's SSE: resumed after `last_event_id`, else from its start."""
        run, _ = await (await self.runs("read")).get(thread_id, run_id)
        # An id that names no seq is taken as none: the stream starts from the run's first part.
        after = parse_seq(last_event_id) if last_event_id else None
        return graph_stream(
            self.pool,
            self.notifier,
            run_id,
            after=after,
            modes=stored_modes(modes),
            heartbeat_s=self.settings.sse_heartbeat_s,
            attempt=max(run.attempt, 1),
            stop=self.stopping,
        )

    async def thread_stream(
        self, thread_id: str, *, last_event_id: str | None, modes: Sequence[str] | None
    ) -> AsyncIterator[str]:
        """Return the thread's SSE: its runs one after another, resumed after `last_event_id`."""
        cursor, parts = parse_cursor(last_event_id), thread_modes(modes)
        async with self.pool.connection() as conn:
            await (await self.threads("read")).row(conn, thread_id)
        return thread_stream(
            self.pool,
            self.notifier,
            thread_id,
            cursor=cursor,
            parts=parts,
            heartbeat_s=self.settings.sse_heartbeat_s,
            stop=self.stopping,
        )

    async def waiting(self, run_id: str) -> AsyncIterator[bytes]:
        """Yield a newline now and then until the run ends, then the run's result as JSON."""
        runs = await self.runs("read")
        waiter = asyncio.ensure_future(runs.wait_for_end(run_id))
        try:
            while True:
                done, _ = await asyncio.wait({waiter}, timeout=self.settings.sse_heartbeat_s)
                if done:
                    break
                yield b"\n"
            waiter.result()
            result: Any = await runs.result(run_id)
            yield jsontext.dumps_bytes(result)
            await self.delivered(run_id)
        finally:
            waiter.cancel()

    async def delivered(self, run_id: str) -> None:
        """Delete the run's thread now if it is marked `on_completion: delete` and has ended."""
        await delete_after_delivery(self.pool, self.graphs.checkpointer, run_id)
