"""Durable extraction jobs: enqueued with the run's completion, claimed with a lease.

A job is inserted in the transaction that stores `run.completed` (only for profiles whose
memory mode is `auto`), so a completed run never lacks its job and the answer never waits
for it. Workers claim jobs with `FOR UPDATE SKIP LOCKED` and a lease token; a worker that
dies leaves the lease to expire and another takes the job over. The model's decision is
saved with its `usage` event before anything is written; applying it is idempotent; the
`memory.updated` event and the job's end are stored in one transaction, under the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass, field
from typing import Any

from langgraph.store.base import BaseStore
from psycopg.types.json import Jsonb

from graphs.events import EventType
from nodes.embeddings.embedder import EmbeddingScope, embedding_scope
from server.agents.store import run_agent
from server.db.pool import Conn, Pool
from server.domain import Run
from server.errors import JobLeaseLostError
from server.events.log import NewEvent, append_events
from server.ids import new_id
from server.memory.extraction import EXISTING_LIMIT, apply_plan, decide
from server.settings import Settings
from server.usage.ledger import MODEL_CALLS
from server.usage.registry import ModelRegistry
from tools.memory.book import MemoryBook

log = logging.getLogger(__name__)

_ENQUEUE = """
INSERT INTO memory_jobs (id, run_id, tenant_id, user_id)
SELECT 'mj_' || %(run)s, %(run)s, %(tenant)s, %(user)s
FROM agent_profiles p
WHERE p.tenant_id = %(tenant)s AND p.name = %(name)s AND p.version = %(version)s
  AND p.spec -> 'memory' ->> 'mode' = 'auto'
ON CONFLICT (run_id) DO NOTHING
"""

_CLAIM = """
UPDATE memory_jobs SET status = 'running', attempts = attempts + 1,
    lease_owner = %(owner)s || ':' || (attempts + 1),
    lease_expires_at = now() + make_interval(secs => %(lease)s), updated_at = now()
WHERE id = (
    SELECT id FROM memory_jobs
    WHERE (status = 'queued' AND (lease_expires_at IS NULL OR lease_expires_at <= now()))
       OR (status = 'running' AND lease_expires_at < now())
    ORDER BY created_at
    FOR UPDATE SKIP LOCKED
    LIMIT 1)
RETURNING *
"""


async def enqueue_extraction(conn: Conn, run: Run) -> None:
    """Queue the run's extraction job if its profile extracts automatically (caller's txn)."""
    await conn.execute(
        _ENQUEUE,
        {
            "run": run.id,
            "tenant": run.tenant_id,
            "user": run.user_id,
            "name": run.agent_name,
            "version": run.agent_version,
        },
    )


@dataclass
class MemoryJobs:
    """Claims and runs extraction jobs in this process."""

    pool: Pool
    store: BaseStore
    models: ModelRegistry
    settings: Settings
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{new_id('mw')}")
    _task: asyncio.Task[None] | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        """Start claiming jobs in the background."""
        self._task = asyncio.create_task(self._loop(), name="memory-jobs")

    async def stop(self) -> None:
        """Stop; a job under way is abandoned to its lease (another worker redoes it)."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                worked = await self.run_one()
            except Exception:
                log.exception("memory jobs: claiming failed; will retry")
                worked = False
            if not worked:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.settings.memory_poll_seconds)

    async def run_one(self) -> bool:
        """Claim and run one job; return whether there was one."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _CLAIM, {"owner": self.owner, "lease": self.settings.memory_lease_seconds}
            )
            job = await cur.fetchone()
        if job is None:
            return False
        renew = asyncio.create_task(self._renew(job))
        try:
            await self._run(job)
        except JobLeaseLostError as exc:
            log.info("memory job %s: %s", job["id"], exc)
        except Exception as exc:
            log.exception("memory job %s failed (attempt %d)", job["id"], job["attempts"])
            await self._failed(job, exc)
        finally:
            renew.cancel()
            await asyncio.gather(renew, return_exceptions=True)
        return True

    async def _renew(self, job: dict[str, Any]) -> None:
        while True:
            await asyncio.sleep(self.settings.memory_lease_seconds / 3)
            async with self.pool.connection() as conn:
                await conn.execute(
                    "UPDATE memory_jobs SET lease_expires_at = now() + make_interval(secs => %s)"
                    " WHERE id = %s AND lease_owner = %s",
                    (self.settings.memory_lease_seconds, job["id"], job["lease_owner"]),
                )

    async def _failed(self, job: dict[str, Any], exc: Exception) -> None:
        final = job["attempts"] >= self.settings.memory_max_attempts
        backoff = min(300.0, 2.0 ** job["attempts"])
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE memory_jobs SET status = %s, error = %s, lease_owner = NULL,"
                " lease_expires_at = CASE WHEN %s THEN NULL"
                " ELSE now() + make_interval(secs => %s) END,"
                " finished_at = CASE WHEN %s THEN now() END, updated_at = now()"
                " WHERE id = %s AND lease_owner = %s",
                (
                    "failed" if final else "queued",
                    f"{type(exc).__name__}: {exc}"[:2000],
                    final,
                    backoff,
                    final,
                    job["id"],
                    job["lease_owner"],
                ),
            )

    async def _run(self, job: dict[str, Any]) -> None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT r.*, i.content AS input_text, o.content AS output_text FROM runs r"
                " LEFT JOIN messages i ON i.id = r.input_message_id"
                " LEFT JOIN messages o ON o.id = r.output_message_id WHERE r.id = %s",
                (job["run_id"],),
            )
            row = await cur.fetchone()
            assert row is not None, f"run {job['run_id']} of job {job['id']} is missing"
            run = Run.from_row(row)
            agent = await run_agent(conn, run.tenant_id, *run.agent)
        said = (row["input_text"] or "", row["output_text"] or "")
        policy = agent.spec.memory
        book = MemoryBook(self.store)
        scope = EmbeddingScope(run.tenant_id, run.user_id, run.id, "extraction")
        plan = job["plan"]
        with embedding_scope(scope):
            if plan is None:
                plan = await self._plan(job, run, said, book, policy.extraction_model)
            changes = await apply_plan(
                book,
                plan,
                job_id=job["id"],
                tenant_id=run.tenant_id,
                user_id=run.user_id,
                run_id=run.id,
                message_id=run.input_message_id,
                duplicate_similarity=policy.duplicate_similarity,
            )
        await self._finish(job, run, plan, changes)

    async def _plan(
        self,
        job: dict[str, Any],
        run: Run,
        said: tuple[str, str],
        book: MemoryBook,
        model: str | None,
    ) -> dict[str, Any]:
        """Ask the model what of the exchange (`said`: the user's, the answer) to keep."""
        user_text, answer = said
        exchange = f"User: {user_text}\nAssistant: {answer}"
        existing = await book.search(
            run.tenant_id,
            user_id=run.user_id,
            scope="user",
            query=user_text or exchange,
            limit=EXISTING_LIMIT,
        )
        model_id = model or self.settings.memory_extraction_model or run.model
        caller = self.models.caller(model_id, totals=run.usage or None)
        emitted: list[dict[str, Any]] = []
        decided = await decide(caller, exchange, existing, emitted.append)
        plan = {
            "model": model_id,
            "operations": [op.model_dump() for op in decided.operations],
            "refs": {
                f"m{i}": {"id": m.id, "text": m.text} for i, m in enumerate(existing, start=1)
            },
        }
        events = [
            NewEvent(
                EventType.USAGE,
                {**{k: v for k, v in e.items() if k != "event"}, "purpose": "memory"},
            )
            for e in emitted
            if e.get("event") == "usage"
        ]
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE memory_jobs SET plan = %s, updated_at = now()"
                " WHERE id = %s AND lease_owner = %s AND plan IS NULL",
                (Jsonb(plan), job["id"], job["lease_owner"]),
            )
            if cur.rowcount != 1:
                raise JobLeaseLostError("plan not saved: the job was taken over")
            if events:
                await append_events(conn, run.id, events, hooks=[MODEL_CALLS])
        return plan

    async def _finish(
        self,
        job: dict[str, Any],
        run: Run,
        plan: dict[str, Any],
        changes: dict[str, list[dict[str, Any]]],
    ) -> None:
        counts = {k: len(v) for k, v in changes.items()}
        data = {"jobId": job["id"], "model": plan.get("model"), **changes, "counts": counts}
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE memory_jobs SET status = 'done', result = %s, finished_at = now(),"
                " updated_at = now(), lease_owner = NULL, lease_expires_at = NULL, error = NULL"
                " WHERE id = %s AND lease_owner = %s",
                (Jsonb(data), job["id"], job["lease_owner"]),
            )
            if cur.rowcount != 1:
                raise JobLeaseLostError("not finished: the job was taken over")
            await append_events(conn, run.id, [NewEvent(EventType.MEMORY_UPDATED, data)])
