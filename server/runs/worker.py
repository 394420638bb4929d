"""The worker: claim queued runs from Postgres, hold their leases, execute, recover, drain.

Claiming bumps the run's lease generation (the fencing token every later write is checked
against) in the statement that stores `run.started`. Claims are serialised by a
transaction-level advisory lock, so per-user and per-tenant limits hold exactly across any
number of worker processes. A queued run's notification is a ticket that names one worker, so
that idle workers do not all claim it (server/runs/tickets.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from typing import Any

from psycopg.types.json import Jsonb

from graphs.events import EventType
from server.db.pool import Conn, Pool, pipelined_transaction
from server.domain import FailureReason
from server.errors import RunFinishedError
from server.events.channels import (
    CANCEL_CHANNEL,
    EVENTS_CHANNEL,
    PAUSE_CHANNEL,
    RUNS_CHANNEL,
    TICKET,
)
from server.events.log import NewEvent, append_events
from server.events.notify import Notifier
from server.ids import new_id
from server.runs.approvals import expire_due
from server.runs.attempt import ExecutorDeps, RunHandle
from server.runs.executor import execute_run
from server.runs.records import (
    CLAIM_LOCK,
    Claim,
    claim_reporting_backlog,
    claim_statement,
    fence_out,
    lock_expired_leases,
    mark_paused,
    posted_claim_statement,
    renew_leases,
)
from server.runs.tickets import any_queued, live_workers, named_worker
from server.settings import Settings
from server.subagents.wake import wake_parents

log = logging.getLogger(__name__)
# Runs of other workers' tickets an idle worker leaves to them before it claims at once.
LEFT_AT_MOST = 64


def claim_params(settings: Settings, owner: str) -> dict[str, Any]:
    """Parameters of the claim query for these settings."""
    return {
        "owner": owner,
        "events_channel": EVENTS_CHANNEL,
        "lease": settings.lease_seconds,
        "timeout": settings.run_timeout_s,
        "user_max": settings.user_max_active_runs,
        "tenant_max": settings.tenant_max_active_runs,
        "overrides": Jsonb(settings.tenant_limits),
    }


class Worker:
    """Execute up to `settings.worker_concurrency` runs at a time in this process."""

    def __init__(self, deps: ExecutorDeps, notifier: Notifier) -> None:
        self.deps = deps
        self.notifier = notifier
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{new_id('w')[-8:]}"
        self._settings = deps.settings
        self._pool: Pool = deps.pool
        params = claim_params(self._settings, self.owner)
        self._claim_sql = claim_statement(params)
        self._posted_sql = posted_claim_statement(params)
        self._reserved = 0  # slots held for posts' claims (`reserve_post`)
        self._wake = asyncio.Event()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._handles: dict[str, RunHandle] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._claiming = False
        # Whether a run may be waiting to be claimed: set by every queued notification, cleared
        # by a claim that saw no other queued run. A run ending claims again only when it is set.
        self._backlog = True
        self._queued_seen = 0  # queued notifications so far, to spot one during a claim
        # The live workers that tickets name, ranked; read at start and at every heartbeat.
        self._live: list[str] = [self.owner]
        # Runs another worker's ticket named while this one was idle, to look at again after
        # `worker_ticket_grace_s` (armed in `_grace`) in case that worker is full, draining or
        # gone.
        self._left: set[str] = set()
        self._grace: asyncio.TimerHandle | None = None
        self._looking: set[asyncio.Task[None]] = set()
        # Set to end a drain early: `stop` then hands every run back without waiting.
        self.hurry = asyncio.Event()

    @property
    def active_runs(self) -> list[str]:
        """Ids of the runs this worker is executing."""
        return list(self._tasks)

    async def start(self) -> None:
        """Register, then start claiming, heartbeating and reaping."""
        self.notifier.on(RUNS_CHANNEL, self._on_queued)
        self.notifier.on(CANCEL_CHANNEL, self._on_cancel)
        self.notifier.on(PAUSE_CHANNEL, self._on_pause)
        async with self._pool.connection() as conn:
            await conn.execute(
                "INSERT INTO workers (id, host, pid, concurrency) VALUES (%s, %s, %s, %s)",
                (self.owner, socket.gethostname(), os.getpid(), self._settings.worker_concurrency),
            )
            await self._read_live(conn)
        self._claiming = True
        self._wake.set()
        self._loops = [
            asyncio.create_task(self._claim_loop(), name="worker-claim"),
            asyncio.create_task(self._heartbeat_loop(), name="worker-heartbeat"),
        ]
        log.info(
            "worker %s started (concurrency %d)", self.owner, self._settings.worker_concurrency
        )

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain: stop claiming, let runs stop at their next step, hand back the rest.

        Runs that reach a step boundary within `grace_s` are re-queued by their executor
        (`run.requeued`, reason `worker draining`); the others are cancelled and re-queued
        (`worker stopped`), at once when `hurry` is set. Neither counts as a recovery.
        """
        grace = self._settings.drain_grace_s if grace_s is None else grace_s
        self._claiming = False
        self._wake.set()
        with contextlib.suppress(Exception):
            async with self._pool.connection() as conn:
                await conn.execute(
                    "UPDATE workers SET draining = true WHERE id = %s", (self.owner,)
                )
        for handle in self._handles.values():
            handle.control.request_drain("shutdown")
        if self._tasks and not self.hurry.is_set():
            finished = asyncio.ensure_future(asyncio.wait(list(self._tasks.values())))
            hurried = asyncio.ensure_future(self.hurry.wait())
            await asyncio.wait({finished, hurried}, timeout=grace, return_when="FIRST_COMPLETED")
            for waiter in (finished, hurried):
                waiter.cancel()
        for run_id in list(self._tasks):
            self._stop_run(run_id, "shutdown")  # a cancel already under way stays a cancel
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        if self._grace is not None:
            self._grace.cancel()
        for loop in (*self._loops, *self._looking):
            loop.cancel()
        await asyncio.gather(*self._loops, *self._looking, return_exceptions=True)
        with contextlib.suppress(Exception):
            async with self._pool.connection() as conn:
                await conn.execute("DELETE FROM workers WHERE id = %s", (self.owner,))
        log.info("worker %s stopped", self.owner)

    def cancel_run(self, run_id: str) -> None:
        """Stop a run this worker executes because its cancel was requested (else nothing).

        The run's executor stores `run.cancelled` once the graph has stopped.
        """
        self._stop_run(run_id, "cancel")

    def _stop_run(self, run_id: str, reason: str) -> None:
        task, handle = self._tasks.get(run_id), self._handles.get(run_id)
        if task is not None and handle is not None and handle.stop_reason is None:
            log.info("run %s: stopping (%s)", run_id, reason)
            handle.stop_reason = reason
            # After the task's first step, which is already scheduled: a task cancelled before
            # it never enters its coroutine, and its run would stay running, its lease renewed.
            asyncio.get_running_loop().call_soon(task.cancel)

    def _on_queued(self, payload: str) -> None:
        """Note that a run is queued; claim now unless it is another worker's (tickets.py)."""
        self._queued_seen += 1
        self._backlog = True
        if not payload.startswith(TICKET):  # "queued", "reconnected": everyone looks
            self._wake.set()
            return
        run_id = payload[len(TICKET) :]
        if self._tasks or named_worker(run_id, self._live) == self.owner:
            self._wake.set()
            return
        # Idle, and another worker's: look again after a grace, if it is still queued. So many
        # left at once is a burst that the named workers may not keep up with: claim now.
        self._left.add(run_id)
        if len(self._left) >= LEFT_AT_MOST:
            self._wake.set()
        elif self._grace is None:
            self._grace = asyncio.get_running_loop().call_later(
                self._settings.worker_ticket_grace_s, self._after_grace
            )

    def _after_grace(self) -> None:
        self._grace = None
        left, self._left = self._left, set()
        task = asyncio.create_task(self._look_again(left), name="worker-look-again")
        self._looking.add(task)
        task.add_done_callback(self._looking.discard)

    async def _look_again(self, left: set[str]) -> None:
        """Claim if a run left to its named worker is still queued."""
        try:
            async with self._pool.connection() as conn:
                waiting = await any_queued(conn, left)
        except Exception:
            log.exception("looking at runs left to other workers failed; claiming")
            waiting = True
        if waiting:
            self._wake.set()

    async def _read_live(self, conn: Conn) -> None:
        # With itself in, whatever its heartbeat's age: it is alive, it is reading.
        live = await live_workers(conn, self._settings.lease_seconds)
        self._live = sorted({*live, self.owner})

    def _on_cancel(self, run_id: str) -> None:
        self.cancel_run(run_id)

    def _on_pause(self, run_id: str) -> None:
        handle = self._handles.get(run_id)
        if handle is not None and not handle.pause_requested:
            handle.request_pause()

    async def _claim_loop(self) -> None:
        reaped_at = 0.0
        while self._claiming:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._settings.worker_poll_seconds)
            self._wake.clear()
            try:
                # Leases and approvals expire without a notification, so reaping goes by the
                # poll interval (as does the sweep for parents whose children ended).
                if time.monotonic() - reaped_at >= self._settings.worker_poll_seconds:
                    reaped_at = time.monotonic()
                    await self.reap_expired()
                    await expire_due(self.deps.pool)
                    await wake_parents(self.deps.pool)
                while self._claiming and self._free_slots() > 0:
                    if not await self.claim_one() or not self._backlog:
                        break
            except Exception:
                log.exception("claiming runs failed; retrying")
                self._backlog = True  # what the failed claim saw was rolled back with it
                await asyncio.sleep(1)
                self._wake.set()  # a second later, not at the next poll

    def _free_slots(self) -> int:
        return self._settings.worker_concurrency - len(self._tasks) - self._reserved

    def reserve_post(self) -> str | None:
        """Hold a slot for the run a post of this process creates; its claim statement.

        None while the worker drains or has no free slot: the run is then queued for any
        worker, as it would be without one here (server/runs/records.py `PostClaimer`).
        """
        if not self._claiming or self._free_slots() <= 0:
            return None
        self._reserved += 1
        return self._posted_sql

    def release_post(self) -> None:
        """Give back a slot `reserve_post` held.

        A run queued while the slot was held found no free one: the claim loop looks again.
        """
        self._reserved -= 1
        if self._backlog:
            self._wake.set()

    def start_posted(self, claim: Claim) -> None:
        """Execute a run a post of this process claimed for this worker."""
        self.deps.metrics.events_written.inc()  # run.started, stored by the claim
        self._start(claim)
        if not self._claiming:  # the drain began while the post was in flight
            self._handles[claim.run.id].control.request_drain("shutdown")

    async def claim_one(self) -> bool:
        """Claim the next claimable run and start it; return False when there was none."""
        seen = self._queued_seen
        # Pipelined: BEGIN and the claim lock go out with the claim statement, which also
        # appends `run.started`; COMMIT goes alone.
        async with self._pool.connection() as conn, pipelined_transaction(conn):
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (CLAIM_LOCK,))
            claim, backlog = await claim_reporting_backlog(conn, self._claim_sql)
            # A run queued while the claim ran may be missing from its snapshot.
            self._backlog = backlog or self._queued_seen != seen
            self.deps.metrics.claims.labels("empty" if claim is None else "found").inc()
            if claim is None:
                return False
            run, generation = claim.run, claim.run.lease_generation
            if run.cancel_requested:
                cancelled = NewEvent(EventType.RUN_CANCELLED, {"reason": "cancel requested"})
                await append_events(
                    conn, run.id, [cancelled], generation=generation, head=claim.head
                )
                self.deps.metrics.events_written.inc()
                return True
            if run.pause_requested:
                # Paused while it was being handed back (drain, lost lease): pause it now.
                paused = NewEvent(
                    EventType.RUN_PAUSED, {"reason": "pause requested", "from": "queued"}
                )
                await append_events(
                    conn,
                    run.id,
                    [paused],
                    generation=generation,
                    head=claim.head,
                    extra=mark_paused,
                )
                self.deps.metrics.events_written.inc()
                return True
        self.deps.metrics.events_written.inc()  # run.started, stored by the claim
        self._start(claim)
        return True

    def _start(self, claim: Claim) -> None:
        handle = RunHandle()
        run_id = claim.run.id
        self._handles[run_id] = handle
        task = asyncio.create_task(self._execute(claim, handle), name=f"run-{run_id}")
        self._tasks[run_id] = task
        # On the task, not in its coroutine: it also frees the slot of a task that ended
        # before its coroutine ran.
        task.add_done_callback(functools.partial(self._forget, run_id))

    def _forget(self, run_id: str, task: asyncio.Task[None]) -> None:
        # A run suspended for approval can be decided and re-claimed by this worker before
        # this task ends: leave the newer task's entry alone.
        if self._tasks.get(run_id) is task:
            del self._tasks[run_id]
            self._handles.pop(run_id, None)
        if self._backlog:  # a slot is free for a run that was waiting
            self._wake.set()

    async def _execute(self, claim: Claim, handle: RunHandle) -> None:
        try:
            await execute_run(self.deps, claim, handle)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("run %s: executor crashed", claim.run.id)

    async def _heartbeat_loop(self) -> None:
        interval = self._settings.lease_seconds / 3
        while True:
            await asyncio.sleep(interval)
            try:
                await self.heartbeat()
            except Exception:
                log.exception("lease heartbeat failed")

    async def heartbeat(self) -> None:
        """Renew our leases; stop runs whose lease we lost or whose cancel we missed.

        Also reads the live workers, whom queued runs' tickets name (server/runs/tickets.py).
        """
        ids = list(self._tasks)
        async with self._pool.connection() as conn:
            await conn.execute(
                "UPDATE workers SET last_heartbeat_at = now(), active_runs = %s WHERE id = %s",
                (len(ids), self.owner),
            )
            kept = (
                await renew_leases(conn, self.owner, ids, self._settings.lease_seconds)
                if ids
                else []
            )
            # After the leases, which matter more if this read fails.
            await self._read_live(conn)
        renewed = {row["id"]: row for row in kept}
        for run_id in ids:
            if run_id not in renewed:
                self._stop_run(run_id, "lease_lost")
            elif renewed[run_id]["cancel_requested"]:
                self._stop_run(run_id, "cancel")
            elif renewed[run_id]["pause_requested"]:
                self._on_pause(run_id)

    async def reap_expired(self) -> int:
        """Re-queue runs whose worker stopped renewing its lease; dead-letter repeat offenders."""
        count = 0
        async with self._pool.connection() as conn, conn.transaction():
            for row in await lock_expired_leases(conn):
                recoveries = row["recoveries"] + 1
                if recoveries > self._settings.max_recoveries:
                    event = NewEvent(
                        EventType.RUN_FAILED,
                        {
                            "errorType": FailureReason.DEAD_LETTER.value,
                            "message": f"the run lost its worker {recoveries} times; the limit is "
                            f"{self._settings.max_recoveries} (AGENTRT_MAX_RECOVERIES)",
                        },
                    )
                else:
                    event = NewEvent(
                        EventType.RUN_REQUEUED,
                        {"reason": "lease expired", "recoveries": recoveries},
                    )
                try:
                    await append_events(conn, row["id"], [event])
                except RunFinishedError:
                    continue
                self.deps.metrics.events_written.inc()
                await fence_out(conn, row["id"], recoveries)
                count += 1
        return count
