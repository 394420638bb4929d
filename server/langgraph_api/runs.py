"""Runs of the LangGraph API: agentrt runs whose `langgraph` options name graph and input.

A run is created by the one writer of the runs table (server/runs/records.py) with its input
as the user message, so it is queued, claimed, leased, recovered and cancelled like every
run, and is visible to the native API too. `multitask_strategy` is the busy policy:
`reject` answers 409, `interrupt` cancels the runs in progress, `rollback` also removes the
checkpoints they wrote before the new run starts, `enqueue` waits behind them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from server.agents.store import resolve_agent
from server.auth import Principal
from server.db.pool import Pool
from server.domain import TERMINAL, Run, RunStatus, status_in
from server.errors import (
    ConversationBusyError,
    InvalidGraphRequestError,
    LangGraphItemNotFoundError,
    RunFinishedError,
    ThreadBusyError,
    ThreadNotFoundError,
)
from server.events.notify import Notifier
from server.langgraph_api.assistant_book import AssistantBook, merged
from server.langgraph_api.auth import Filters
from server.langgraph_api.expiry import delete_after_run
from server.langgraph_api.graphs import GraphRegistry
from server.langgraph_api.parts import API_MODES
from server.langgraph_api.rollback import delete_run_checkpoints
from server.langgraph_api.serde import to_json
from server.langgraph_api.threads import ThreadKeeper
from server.langgraph_api.webhooks import add_webhook, check_url
from server.runs.records import create_run, delete_finished_run, request_cancel
from server.settings import Settings
from server.timestamps import iso

STRATEGIES = {"reject": "reject", "interrupt": "interrupt", "rollback": "interrupt"}
# Run fields kept in `runs.options["langgraph"]`, as the SDK sends them.
KEPT = (
    "input",
    "command",
    "config",
    "context",
    "metadata",
    "stream_mode",
    "stream_subgraphs",
    "interrupt_before",
    "interrupt_after",
    "checkpoint_id",
    "durability",
    "multitask_strategy",
    "webhook",
    "on_completion",
    "after_seconds",
)
# A stateless run's thread marked for deletion lives at most this long before its run exists.
ORPHAN_THREAD_S = 3600.0
# Whether a run of `runs r` stopped at an interrupt (its log holds `graph.interrupted`): read
# only for a completed run, the one status it changes (`lg_status`), and only in the log's
# days of the run's life, whose bounds Postgres prunes the other days' partitions by.
INTERRUPTED = (
    "CASE WHEN r.status = 'completed' THEN EXISTS (SELECT 1 FROM run_events e"
    " WHERE e.run_id = r.id AND e.type = 'graph.interrupted'"
    " AND e.ts >= r.created_at - interval '1 day' AND e.ts <= r.updated_at + interval '1 day')"
    " ELSE false END AS interrupted"
)
_SELECT = f"SELECT r.*, {INTERRUPTED} FROM runs r"


def lg_status(run: Run, interrupted: bool) -> str:
    """Return the LangGraph status of a run."""
    if run.status == RunStatus.COMPLETED:
        return "interrupted" if interrupted else "success"
    if run.status == RunStatus.FAILED:
        return "timeout" if run.error_type == "timeout" else "error"
    if run.status == RunStatus.CANCELLED:
        return "interrupted"
    if run.status in (RunStatus.QUEUED, RunStatus.PAUSED):
        return "pending"
    return "running"


def run_view(run: Run, interrupted: bool = False) -> dict[str, Any]:
    """Return a run as LangGraph's `Run`."""
    params = run.options.get("langgraph", {})
    return {
        "run_id": run.id,
        "thread_id": run.conversation_id,
        "assistant_id": params.get("assistant_id"),
        "created_at": iso(run.created_at),
        "updated_at": iso(run.updated_at),
        "status": lg_status(run, interrupted),
        "metadata": params.get("metadata") or {},
        "multitask_strategy": params.get("multitask_strategy") or "enqueue",
        "kwargs": {k: params.get(k) for k in KEPT if k not in ("metadata", "multitask_strategy")},
    }


@dataclass(frozen=True)
class LangGraphRuns:
    """What the LangGraph API asks of runs, for one caller."""

    pool: Pool
    graphs: GraphRegistry
    notifier: Notifier
    settings: Settings
    who: Principal
    filters: Filters = field(default_factory=dict)

    @property
    def threads(self) -> ThreadKeeper:
        """The caller's threads (those the auth handlers' filters let through)."""
        visibility = self.settings.langgraph_thread_visibility.get(self.who.tenant_id, "owner")
        return ThreadKeeper(self.pool, self.graphs, self.who, self.filters, visibility)

    async def create(self, thread_id: str | None, body: dict[str, Any]) -> dict[str, Any]:
        """Queue a run on `thread_id` (a new thread when None); return its view.

        Raises:
            UnknownReferenceError: `assistant_id` names no graph or assistant.
            ThreadNotFoundError: no such thread and `if_not_exists` is not `create`.
            ThreadBusyError: the thread is busy and the strategy is `reject`.
        """
        book = AssistantBook(self.pool, self.graphs, self.who)
        assistant, entry = await book.named(str(body.get("assistant_id") or ""))
        if body.get("input") is not None and body.get("command"):
            raise InvalidGraphRequestError("send either `input` or `command`, not both")
        if body.get("command") and thread_id is None:
            raise InvalidGraphRequestError("a command resumes a thread: send it to one")
        config = body.get("config") or {}
        if body.get("context") and config.get("configurable"):
            raise InvalidGraphRequestError("send either `context` or `config.configurable`")
        modes = body.get("stream_mode") or ["values"]
        modes = [modes] if isinstance(modes, str) else list(modes)
        unknown = [m for m in modes if m not in API_MODES]
        if unknown:
            raise InvalidGraphRequestError(
                f"stream modes {unknown} are not served; use any of {sorted(API_MODES)}"
            )
        if body.get("webhook"):
            check_url(str(body["webhook"]))
        strategy = body.get("multitask_strategy") or "enqueue"
        if strategy not in ("reject", "interrupt", "rollback", "enqueue"):
            raise InvalidGraphRequestError(f"unknown multitask_strategy {strategy!r}")
        metadata = {"graph_id": entry.graph_id, "assistant_id": assistant["assistant_id"]}
        # LangGraph's default: a stateless run's thread goes with it unless the client keeps it.
        delete_after = thread_id is None and (body.get("on_completion") or "delete") == "delete"
        if thread_id is None:
            orphan_s = ORPHAN_THREAD_S if delete_after else None
            thread = await self.threads.create(None, metadata, expires_in_s=orphan_s)
            thread_id = thread["thread_id"]
        else:
            await self._ensure_thread(thread_id, metadata, body.get("if_not_exists") or "reject")
        params = {k: body.get(k) for k in KEPT}
        context = {**assistant["context"], **(body.get("context") or {})}
        params.update(
            graph_id=entry.graph_id,
            assistant_id=assistant["assistant_id"],
            config=merged(assistant["config"], config) or None,
            context=context or None,
            stream_mode=modes,
            multitask_strategy=strategy,
        )
        agent = ("default", 0)
        if entry.own:  # an assistant of agentrt's agent names its profile in `context.agent`
            async with self.pool.connection() as conn:
                found = await resolve_agent(conn, self.who.tenant_id, context.get("agent"))
            agent = (found.name, found.version)
        if strategy == "rollback":
            params["rollback_runs"] = await self._in_progress(thread_id)
        content = json.dumps(to_json(body.get("command") or body.get("input")))
        try:
            run = await create_run(
                self.pool,
                self.who,
                thread_id,
                content,
                self.settings.default_model,
                {"langgraph": params},
                if_busy=STRATEGIES.get(strategy, "enqueue"),
                agent=agent,
                after_s=body.get("after_seconds") or None,
            )
        except ConversationBusyError as exc:
            raise ThreadBusyError(thread_id, exc.run_id) from exc
        if delete_after:
            async with self.pool.connection() as conn:
                await delete_after_run(conn, thread_id, run.id)
        if body.get("webhook"):
            await add_webhook(self.pool, run.id, body["webhook"])
        return run_view(run)

    async def _ensure_thread(self, thread_id: str, metadata: dict[str, Any], missing: str) -> None:
        try:
            await self.threads.update(thread_id, metadata)
        except ThreadNotFoundError:
            if missing != "create":
                raise
            await self.threads.create(thread_id, metadata, "do_nothing")

    async def _in_progress(self, thread_id: str) -> list[str]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT id FROM runs WHERE conversation_id = %s AND NOT {status_in(TERMINAL)}",
                (thread_id,),
            )
            return [r["id"] for r in await cur.fetchall()]

    async def get(self, thread_id: str | None, run_id: str) -> tuple[Run, bool]:
        """Return the caller's run and whether it ended on an interrupt."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                f"{_SELECT} WHERE r.id = %s AND r.tenant_id = %s",
                (run_id, self.who.tenant_id),
            )
            found = await cur.fetchone()
        if found is None or (thread_id is not None and found["conversation_id"] != thread_id):
            raise LangGraphItemNotFoundError(f"run {run_id} not found")
        async with self.pool.connection() as conn:
            try:  # a run is the caller's when its thread is
                await self.threads.row(conn, found["conversation_id"])
            except ThreadNotFoundError:
                raise LangGraphItemNotFoundError(f"run {run_id} not found") from None
        return Run.from_row(found), bool(found["interrupted"])

    async def view(self, thread_id: str | None, run_id: str) -> dict[str, Any]:
        """Return the run as LangGraph's `Run`."""
        return run_view(*await self.get(thread_id, run_id))

    async def list(
        self, thread_id: str, limit: int, offset: int, status: str | None
    ) -> list[dict[str, Any]]:
        """List the thread's runs, newest first."""
        async with self.pool.connection() as conn:
            await self.threads.row(conn, thread_id)
            cur = await conn.execute(
                f"{_SELECT} WHERE r.conversation_id = %s ORDER BY r.created_at DESC, r.id DESC",
                (thread_id,),
            )
            rows = await cur.fetchall()
        views = [run_view(Run.from_row(r), bool(r["interrupted"])) for r in rows]
        if status:
            views = [v for v in views if v["status"] == status]
        return views[offset : offset + limit]

    async def delete(self, thread_id: str, run_id: str) -> None:
        """Delete a finished run's record (its events go with it).

        Raises:
            ConflictError: the run has not finished.
        """
        run, _ = await self.get(thread_id, run_id)
        if not run.is_terminal:
            raise InvalidGraphRequestError(f"run {run_id} is {run.status}; cancel it first")
        async with self.pool.connection() as conn:
            await delete_finished_run(conn, run_id)

    async def cancel(self, thread_id: str | None, run_id: str, *, wait: bool, action: str) -> None:
        """Cancel a run; with `rollback`, also remove the checkpoints it wrote."""
        run, _ = await self.get(thread_id, run_id)
        try:
            await request_cancel(self.pool, self.who, run_id)
        except RunFinishedError:
            if action != "rollback":
                raise
        if wait or action == "rollback":
            await self.wait_for_end(run_id)
        if action == "rollback":
            await delete_run_checkpoints(self.pool, run.conversation_id, [run_id])

    async def cancel_many(self, body: dict[str, Any], action: str) -> None:
        """Cancel the runs named by `run_ids`, or those of `thread_id` in `status`."""
        ids = list(body.get("run_ids") or [])
        if not ids and body.get("thread_id"):
            wanted = {"pending": "pending", "running": "running"}.get(body.get("status") or "all")
            for view in await self.list(str(body["thread_id"]), 10_000, 0, wanted):
                if view["status"] in ("pending", "running"):
                    ids.append(view["run_id"])
        for run_id in ids:
            try:
                await self.cancel(None, run_id, wait=False, action=action)
            except RunFinishedError:
                continue

    async def wait_for_end(self, run_id: str, heartbeat_s: float = 5.0) -> Run:
        """Wait until the run is finished; return it."""
        with self.notifier.watch_run(run_id) as wake:
            while True:
                wake.clear()
                run, _ = await self.get(None, run_id)
                if run.is_terminal:
                    return run
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), heartbeat_s)

    async def result(self, run_id: str) -> dict[str, Any]:
        """Return what `wait` and `join` answer: the values the run left, or its error."""
        run, _ = await self.get(None, run_id)
        if run.status == RunStatus.FAILED:
            return {"__error__": {"error": run.error_type, "message": run.error_message}}
        state = await self.threads.state_after(run.conversation_id, run_id)
        return to_json(state.values) if state is not None else {}
