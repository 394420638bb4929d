"""The worker: claim queued runs from Postgres, hold their leases, execute, recover.

Claiming uses `FOR UPDATE SKIP LOCKED` and bumps the run's lease generation (the fencing token
every later write is checked against), in the same transaction that stores `run.started`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from typing import Any

from server.approvals import expire_due
from server.eventlog import NewEvent, RunFinishedError, append_events, load_head
from server.executor import ExecutorDeps, execute_run
from server.ids import new_id
from server.notify import CANCEL_CHANNEL, RUNS_CHANNEL, Notifier

log = logging.getLogger(__name__)

_CLAIM = """
WITH next AS (
    SELECT r.id FROM runs r
    WHERE r.status = 'queued'
      AND NOT EXISTS (
          SELECT 1 FROM runs o WHERE o.conversation_id = r.conversation_id
            AND (o.status IN ('running', 'waiting_tool', 'waiting_user', 'paused')
                 OR (o.status = 'queued' AND o.created_at < r.created_at)))
    ORDER BY r.created_at
    LIMIT 1
    FOR UPDATE OF r SKIP LOCKED
)
UPDATE runs SET
    lease_owner = %(owner)s,
    lease_generation = runs.lease_generation + 1,
    lease_expires_at = now() + make_interval(secs => %(lease)s),
    attempt = runs.attempt + 1,
    updated_at = now()
FROM next WHERE runs.id = next.id
RETURNING runs.*
"""

_HEARTBEAT = """
UPDATE runs SET lease_expires_at = now() + make_interval(secs => %(lease)s)
WHERE lease_owner = %(owner)s AND id = ANY(%(ids)s)
"""

_EXPIRED = """
SELECT id FROM runs
WHERE status IN ('running', 'waiting_tool') AND lease_expires_at < now()
ORDER BY lease_expires_at LIMIT 100
FOR UPDATE SKIP LOCKED
"""


class Worker:
    """Execute up to `settings.worker_concurrency` runs at a time in this process."""

    def __init__(self, deps: ExecutorDeps, notifier: Notifier) -> None:
        self.deps = deps
        self.notifier = notifier
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{new_id('w')[-8:]}"
        self._settings = deps.settings
        self._wake = asyncio.Event()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self) -> None:
        """Start claiming, heartbeating and reaping."""
        self.notifier.on(RUNS_CHANNEL, lambda _payload: self._wake.set())
        self.notifier.on(CANCEL_CHANNEL, self._on_cancel)
        self._wake.set()
        self._loops = [
            asyncio.create_task(self._claim_loop(), name="worker-claim"),
            asyncio.create_task(self._heartbeat_loop(), name="worker-heartbeat"),
        ]
        log.info(
            "worker %s started (concurrency %d)", self.owner, self._settings.worker_concurrency
        )

    async def stop(self) -> None:
        """Stop claiming, then cancel the runs in flight; their leases expire for recovery."""
        self._stopping = True
        for task in [*self._loops, *self._tasks.values()]:
            task.cancel()
        await asyncio.gather(*self._loops, *self._tasks.values(), return_exceptions=True)

    @property
    def active_runs(self) -> list[str]:
        """Ids of the runs this worker is executing."""
        return list(self._tasks)

    def _on_cancel(self, run_id: str) -> None:
        task = self._tasks.get(run_id)
        if task is not None:
            task.cancel()

    async def _claim_loop(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._settings.worker_poll_seconds)
            self._wake.clear()
            try:
                await self.reap_expired()
                await expire_due(self.deps.pool)
                while len(self._tasks) < self._settings.worker_concurrency:
                    if not await self.claim_one():
                        break
            except Exception:
                log.exception("claiming runs failed; retrying")
                await asyncio.sleep(1)

    async def claim_one(self) -> bool:
        """Claim the oldest claimable run and start it; return False when there was none."""
        async with self.deps.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                _CLAIM, {"owner": self.owner, "lease": self._settings.lease_seconds}
            )
            run = await cur.fetchone()
            if run is None:
                return False
            head = await load_head(conn, run["id"], lock=False)
            if run["cancel_requested"]:
                await append_events(
                    conn,
                    run["id"],
                    [NewEvent("run.cancelled", {"reason": "cancel requested"})],
                    generation=run["lease_generation"],
                )
                return True
            head, _ = await append_events(
                conn,
                run["id"],
                [NewEvent("run.started", {"attempt": run["attempt"], "worker": self.owner})],
                generation=run["lease_generation"],
                head=head,
            )
        task = asyncio.create_task(self._execute(run, head), name=f"run-{run['id']}")
        self._tasks[run["id"]] = task
        return True

    async def _execute(self, run: dict[str, Any], head: Any) -> None:
        try:
            await execute_run(self.deps, run, head)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("run %s: executor crashed", run["id"])
        finally:
            # A run suspended for approval can be decided and re-claimed by this worker before
            # this task ends: leave the newer task's entry alone.
            if self._tasks.get(run["id"]) is asyncio.current_task():
                del self._tasks[run["id"]]
            self._wake.set()

    async def _heartbeat_loop(self) -> None:
        interval = self._settings.lease_seconds / 3
        while not self._stopping:
            await asyncio.sleep(interval)
            if not self._tasks:
                continue
            try:
                async with self.deps.pool.connection() as conn:
                    await conn.execute(
                        _HEARTBEAT,
                        {
                            "lease": self._settings.lease_seconds,
                            "owner": self.owner,
                            "ids": list(self._tasks),
                        },
                    )
            except Exception:
                log.exception("lease heartbeat failed")

    async def reap_expired(self) -> int:
        """Re-queue runs whose worker stopped renewing its lease; return how many."""
        count = 0
        async with self.deps.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(_EXPIRED)
            for row in await cur.fetchall():
                try:
                    await append_events(
                        conn,
                        row["id"],
                        [NewEvent("run.requeued", {"reason": "lease expired"})],
                    )
                    count += 1
                except RunFinishedError:
                    continue
            if count:
                await conn.execute("SELECT pg_notify(%s, 'queued')", (RUNS_CHANNEL,))
        return count
