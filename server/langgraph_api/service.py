"""What the LangGraph API's routes ask for, bound to one caller and this process's parts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from langgraph.store.base import BaseStore

from server.auth import Principal
from server.db.pool import Pool
from server.errors import MemoryUnavailableError
from server.events.notify import Notifier
from server.langgraph_api.crons import CronBook
from server.langgraph_api.graphs import GraphRegistry
from server.langgraph_api.runs import LangGraphRuns
from server.langgraph_api.store import StoreGate
from server.langgraph_api.stream import graph_stream, stored_modes
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

    @property
    def threads(self) -> ThreadKeeper:
        """The caller's threads."""
        return ThreadKeeper(self.pool, self.graphs, self.who)

    @property
    def runs(self) -> LangGraphRuns:
        """The caller's runs."""
        return LangGraphRuns(self.pool, self.graphs, self.notifier, self.settings, self.who)

    @property
    def crons(self) -> CronBook:
        """The caller's crons."""
        return CronBook(self.pool, self.graphs, self.who)

    @property
    def store(self) -> StoreGate:
        """The store as the caller may use it.

        Raises:
            MemoryUnavailableError: this process runs without a store.
        """
        if self.store_ is None:
            raise MemoryUnavailableError("this server has no store")
        return StoreGate(self.store_, self.who)

    async def stream(
        self,
        run_id: str,
        *,
        last_event_id: str | None,
        modes: list[str] | None = None,
        thread_id: str | None = None,
    ) -> AsyncIterator[str]:
        """Return the run's SSE: resumed after `last_event_id`, else from its start."""
        run, _ = await self.runs.get(thread_id, run_id)
        after = int(last_event_id) if last_event_id and last_event_id.isdigit() else None
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

    async def waiting(self, run_id: str) -> AsyncIterator[bytes]:
        """Yield a newline now and then until the run ends, then the run's result as JSON."""
        waiter = asyncio.ensure_future(self.runs.wait_for_end(run_id))
        try:
            while True:
                done, _ = await asyncio.wait({waiter}, timeout=self.settings.sse_heartbeat_s)
                if done:
                    break
                yield b"\n"
            waiter.result()
            result: Any = await self.runs.result(run_id)
            yield json.dumps(result).encode()
        finally:
            waiter.cancel()
