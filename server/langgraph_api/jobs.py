"""The LangGraph API's background work in a worker process.

It fires due crons, delivers webhooks, and sweeps threads past their `ttl` or their
`on_completion: delete` run, and store items past their `ttl`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
from langgraph.store.postgres import AsyncPostgresStore

from server.auth import Principal
from server.db.pool import Pool
from server.errors import UnknownReferenceError
from server.events.notify import Notifier
from server.langgraph_api.crons import claim_firing, disable_cron, mark_fired
from server.langgraph_api.expiry import sweep_threads
from server.langgraph_api.graphs import GraphRegistry
from server.langgraph_api.runs import LangGraphRuns
from server.langgraph_api.webhooks import claim_delivery, deliver
from server.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class LangGraphJobs:
    """Polls for due crons and webhooks; every worker process runs one."""

    pool: Pool
    graphs: GraphRegistry
    notifier: Notifier
    settings: Settings
    store: AsyncPostgresStore | None = None
    http: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(timeout=10))
    _task: asyncio.Task[None] | None = None
    _swept_at: float = float("-inf")
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        """Start polling."""
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Stop polling; a firing or delivery in flight is finished or left to be retried."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.http.aclose()

    async def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                worked = await self.run_once()
            except Exception:
                log.exception("LangGraph jobs: a poll failed; will retry")
                worked = False
            if not worked:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.settings.worker_poll_seconds)

    def _runs(self, row: dict[str, Any]) -> LangGraphRuns:
        who = Principal(row["tenant_id"], row["user_id"], frozenset(row.get("roles") or ()))
        return LangGraphRuns(self.pool, self.graphs, self.notifier, self.settings, who)

    async def run_once(self) -> bool:
        """Fire one due cron and deliver one due webhook; say whether there was work."""
        worked = False
        claimed = await claim_firing(self.pool)
        if claimed is not None:
            await self._fire(*claimed)
            worked = True
        delivery = await claim_delivery(self.pool)
        if delivery is not None:
            runs = self._runs({**delivery, "roles": ["admin"]})
            body = {**await runs.view(None, delivery["run_id"])}
            result = await runs.result(delivery["run_id"])
            if "__error__" in result:
                body["error"] = result["__error__"]
            else:
                body["values"] = result
            await deliver(self.pool, self.http, delivery, body)
            worked = True
        await self.sweep()
        return worked

    async def sweep(self, *, now: bool = False) -> None:
        """Delete expired threads and store items, at most every `langgraph_sweep_s`."""
        clock = asyncio.get_running_loop().time()
        if not now and clock - self._swept_at < self.settings.langgraph_sweep_s:
            return
        self._swept_at = clock
        await sweep_threads(
            self.pool, self.graphs.checkpointer, self.settings.langgraph_delete_grace_s
        )
        if self.store is not None:
            await self.store.sweep_ttl()

    async def _fire(self, cron: dict[str, Any], due: datetime) -> None:
        body = {**cron["payload"], "metadata": {**cron["metadata"], "cron_id": cron["cron_id"]}}
        try:
            run = await self._runs(cron).create(cron["thread_id"], body)
        except UnknownReferenceError as exc:
            # Its assistant was deleted while the cron was created or claimed: every firing
            # would fail.
            log.warning("cron %s: %s; the cron is disabled", cron["cron_id"], exc)
            await mark_fired(self.pool, cron["cron_id"], due, f"error: {exc}"[:200])
            await disable_cron(self.pool, cron["cron_id"])
            return
        except Exception as exc:
            # Recorded as its run id so that the firing is not started again and again.
            log.exception("cron %s: its run could not be created", cron["cron_id"])
            await mark_fired(self.pool, cron["cron_id"], due, f"error: {exc}"[:200])
            return
        await mark_fired(self.pool, cron["cron_id"], due, run["run_id"])
