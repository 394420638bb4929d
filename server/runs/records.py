"""Conversations, messages and run records: every query scoped by the caller's tenant."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from server.auth import Principal
from server.db.pool import Pool, retry_deadlocks
from server.domain import RunStatus, is_terminal
from server.events.log import (
    Conn,
    NewEvent,
    RunFinishedError,
    RunNotFoundError,
    append_events,
    new_head,
)
from server.events.notify import CANCEL_CHANNEL
from server.ids import new_id
from server.runs.idempotency import IdempotencyKey, find_response, remember_response


class ConversationNotFoundError(LookupError):
    """No such conversation for this tenant."""


class ConversationBusyError(RuntimeError):
    """The conversation has a run in progress and the policy is `reject`."""

    def __init__(self, conversation_id: str, run_id: str, status: str) -> None:
        super().__init__(
            f"conversation {conversation_id} has run {run_id} in progress ({status}); wait for "
            "it, cancel it, or send again with ifBusy 'enqueue' or 'interrupt'"
        )
        self.run_id = run_id


class TooManyRunsError(RuntimeError):
    """The user has as many runs in progress as the limit allows (policy `reject`)."""

    def __init__(self, limit: int, count: int) -> None:
        super().__init__(
            f"you have {count} runs queued or running; the limit is {limit}. Wait for one to "
            "finish or cancel one"
        )


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def conversation_view(row: dict[str, Any]) -> dict[str, Any]:
    """Render a conversation row for the API."""
    return {
        "conversationId": row["id"],
        "title": row["title"],
        "model": row["model"],
        "agent": row["agent"],
        "metadata": row["metadata"],
        "userId": row["user_id"],
        "createdAt": _iso(row["created_at"]),
    }


def run_view(row: dict[str, Any]) -> dict[str, Any]:
    """Render a run row for the API."""
    error = None
    if row["error_type"]:
        error = {
            "type": row["error_type"],
            "message": row["error_message"],
            **(row.get("error_details") or {}),
        }
    return {
        "runId": row["id"],
        "conversationId": row["conversation_id"],
        "userId": row["user_id"],
        "status": row["status"],
        "model": row["model"],
        "agent": {"name": row["agent_name"], "version": row["agent_version"]},
        "options": row["options"],
        "inputMessageId": row["input_message_id"],
        "outputMessageId": row["output_message_id"],
        "attempt": row["attempt"],
        "error": error,
        "lastEventId": row["last_event_seq"],
        "usage": row["usage"],
        "cancelRequested": row["cancel_requested"],
        "pauseRequested": row["pause_requested"] and not is_terminal(row["status"]),
        "pausedAt": _iso(row["paused_at"]),
        "leaseOwner": row["lease_owner"],
        "recoveries": row["recoveries"],
        "createdAt": _iso(row["created_at"]),
        "startedAt": _iso(row["started_at"]),
        "finishedAt": _iso(row["finished_at"]),
    }


def message_view(row: dict[str, Any]) -> dict[str, Any]:
    """Render a message row for the API."""
    return {
        "messageId": row["id"],
        "conversationId": row["conversation_id"],
        "runId": row["run_id"],
        "role": row["role"],
        "content": row["content"],
        "createdAt": _iso(row["created_at"]),
    }


async def create_conversation(
    pool: Pool,
    who: Principal,
    title: str | None,
    model: str | None,
    metadata: dict[str, Any],
    agent: str | None = None,
) -> dict[str, Any]:
    """Create a conversation owned by the caller (`agent`: the profile its runs use)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "INSERT INTO conversations (id, tenant_id, user_id, title, model, metadata, agent)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING *",
            (new_id("conv"), who.tenant_id, who.user_id, title, model, Jsonb(metadata), agent),
        )
        row = await cur.fetchone()
    assert row is not None
    return row


async def get_conversation(
    conn: Conn, who: Principal, conversation_id: str, *, lock: bool = False
) -> dict[str, Any]:
    """Return the tenant's conversation (locked if `lock`), or raise ConversationNotFoundError.

    The lock is `FOR NO KEY UPDATE`, which lets a worker insert rows that reference the
    conversation (the assistant message) meanwhile; `FOR UPDATE` would block those inserts'
    foreign-key checks while we wait for that worker's run row: a deadlock.
    """
    cur = await conn.execute(
        "SELECT * FROM conversations WHERE id = %s AND tenant_id = %s"
        + (" FOR NO KEY UPDATE" if lock else ""),
        (conversation_id, who.tenant_id),
    )
    row = await cur.fetchone()
    if row is None:
        raise ConversationNotFoundError(conversation_id)
    return row


_IN_PROGRESS = "('queued', 'running', 'waiting_tool', 'waiting_user', 'paused')"
# A paused run holds its conversation but not a place under the user's run limit.
_COUNTED = "('queued', 'running', 'waiting_tool', 'waiting_user')"


async def _apply_busy_policy(conn: Conn, who: Principal, conversation_id: str, policy: str) -> None:
    if policy == "enqueue":
        return
    cur = await conn.execute(
        f"SELECT id, status FROM runs WHERE conversation_id = %s AND status IN {_IN_PROGRESS}"
        " ORDER BY created_at, id FOR NO KEY UPDATE",
        (conversation_id,),
    )
    busy = await cur.fetchall()
    if not busy:
        return
    if policy == "reject":
        raise ConversationBusyError(conversation_id, busy[0]["id"], busy[0]["status"])
    for row in busy:
        await cancel_locked(conn, row["id"], RunStatus(row["status"]), who.user_id)


async def _refuse_over_limit(conn: Conn, who: Principal, limit: int) -> None:
    cur = await conn.execute(
        f"SELECT count(*) AS n FROM runs WHERE tenant_id = %s AND user_id = %s"
        f" AND status IN {_COUNTED}",
        (who.tenant_id, who.user_id),
    )
    row = await cur.fetchone()
    if row is not None and row["n"] >= limit:
        raise TooManyRunsError(limit, row["n"])


async def create_run(
    pool: Pool,
    who: Principal,
    conversation_id: str,
    content: str,
    model: str,
    options: dict[str, Any],
    *,
    if_busy: str = "enqueue",
    user_limit: int | None = None,
    model_source: str | None = None,
    agent: tuple[str, int] = ("default", 0),
) -> dict[str, Any]:
    """Store the user message and a queued run with its `run.created` event, atomically.

    Args:
        if_busy: What to do when the conversation already has a run in progress: `enqueue`
            (run after it), `reject` (ConversationBusyError), `interrupt` (cancel it first).
        user_limit: With the `reject` limit policy, the most runs a user may have queued or
            active; beyond it, TooManyRunsError. None queues without limit.
        model_source: Why this model was picked (server/usage/routing.py), kept in the event.
        agent: The agent profile's name and the exact version the run uses.
    """
    message = _NewMessage(conversation_id, content, model, options, if_busy, user_limit, agent)

    async def attempt() -> dict[str, Any]:
        async with pool.connection() as conn, conn.transaction():
            await get_conversation(conn, who, conversation_id, lock=True)
            return await _insert_run(conn, who, message, model_source)

    return await retry_deadlocks(attempt)


async def accept_message(
    pool: Pool,
    who: Principal,
    conversation_id: str,
    content: str,
    model: str,
    options: dict[str, Any],
    *,
    if_busy: str = "enqueue",
    user_limit: int | None = None,
    model_source: str | None = None,
    idempotency: IdempotencyKey | None = None,
    agent: tuple[str, int] = ("default", 0),
) -> tuple[dict[str, Any], bool]:
    """Like `create_run`, but return the API's answer and whether it replays an earlier one.

    With an idempotency key already used with the same body, nothing is created and the
    first answer is returned; the key is checked before the busy policy and the limits, so a
    retry is never refused because of the run the first attempt created.

    Raises:
        IdempotencyKeyReusedError: the key was used with a different body.
    """
    message = _NewMessage(conversation_id, content, model, options, if_busy, user_limit, agent)

    async def attempt() -> tuple[dict[str, Any], bool]:
        async with pool.connection() as conn, conn.transaction():
            await get_conversation(conn, who, conversation_id, lock=True)
            if idempotency is not None:
                earlier = await find_response(conn, conversation_id, idempotency)
                if earlier is not None:
                    return earlier, True
            row = await _insert_run(conn, who, message, model_source)
            response = accepted_view(row, model_source)
            if idempotency is not None:
                await remember_response(
                    conn, who.tenant_id, conversation_id, idempotency, row["id"], response
                )
        return response, False

    return await retry_deadlocks(attempt)


def accepted_view(row: dict[str, Any], model_source: str | None) -> dict[str, Any]:
    """Render the answer to a posted message from its new run's row."""
    return {
        "runId": row["id"],
        "status": row["status"],
        "conversationId": row["conversation_id"],
        "messageId": row["input_message_id"],
        "model": row["model"],
        "modelSource": model_source,
        "agent": {"name": row["agent_name"], "version": row["agent_version"]},
        "streamUrl": f"/api/runs/{row['id']}/events",
        "snapshotUrl": f"/api/runs/{row['id']}/snapshot",
    }


@dataclass(frozen=True)
class _NewMessage:
    conversation_id: str
    content: str
    model: str
    options: dict[str, Any]
    if_busy: str
    user_limit: int | None
    agent: tuple[str, int] = ("default", 0)


async def _insert_run(
    conn: Conn, who: Principal, message: _NewMessage, model_source: str | None
) -> dict[str, Any]:
    """Apply the busy policy and limits, then insert the message, the run and `run.created`.

    The caller holds the conversation's row lock, taken before any run's: one lock order.
    """
    conversation_id = message.conversation_id
    message_id, run_id = new_id("msg"), new_id("run")
    await _apply_busy_policy(conn, who, conversation_id, message.if_busy)
    if message.user_limit is not None:
        await _refuse_over_limit(conn, who, message.user_limit)
    await conn.execute(
        "INSERT INTO messages (id, conversation_id, tenant_id, user_id, run_id, role, content)"
        " VALUES (%s, %s, %s, %s, %s, 'user', %s)",
        (message_id, conversation_id, who.tenant_id, who.user_id, run_id, message.content),
    )
    await conn.execute(
        "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model, options,"
        " input_message_id, principal_roles, agent_name, agent_version)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            run_id,
            conversation_id,
            who.tenant_id,
            who.user_id,
            message.model,
            Jsonb(message.options),
            message_id,
            sorted(who.roles),
            *message.agent,
        ),
    )
    await append_events(
        conn,
        run_id,
        head=new_head(run_id),
        events=[
            NewEvent(
                "run.created",
                {
                    "conversationId": conversation_id,
                    "model": message.model,
                    "modelSource": model_source,
                    "agent": f"{message.agent[0]}@{message.agent[1]}",
                    "inputMessageId": message_id,
                },
            )
        ],
    )
    cur = await conn.execute("SELECT * FROM runs WHERE id = %s", (run_id,))
    row = await cur.fetchone()
    assert row is not None
    return row


async def get_run(conn: Conn, who: Principal, run_id: str, *, lock: bool = False) -> dict[str, Any]:
    """Return the tenant's run (locked if `lock`) or raise RunNotFoundError."""
    cur = await conn.execute(
        "SELECT * FROM runs WHERE id = %s AND tenant_id = %s"
        + (" FOR NO KEY UPDATE" if lock else ""),
        (run_id, who.tenant_id),
    )
    row = await cur.fetchone()
    if row is None:
        raise RunNotFoundError(run_id)
    return row


async def list_messages(pool: Pool, who: Principal, conversation_id: str) -> list[dict[str, Any]]:
    """List a conversation's stored messages in order."""
    async with pool.connection() as conn:
        await get_conversation(conn, who, conversation_id)
        cur = await conn.execute(
            "SELECT * FROM messages WHERE conversation_id = %s ORDER BY position",
            (conversation_id,),
        )
        return await cur.fetchall()


async def cancel_locked(conn: Conn, run_id: str, status: RunStatus, by: str) -> None:
    """Cancel a run whose row the caller holds locked (`SELECT … FOR NO KEY UPDATE`).

    A run no worker holds is cancelled here and now; a running one is flagged and its worker,
    wherever it runs, is told through NOTIFY (the heartbeat catches a missed notification).

    Raises:
        RunFinishedError: the run already ended.
    """
    reason = {"reason": "cancel requested", "by": by}
    if status in (RunStatus.QUEUED, RunStatus.WAITING_USER, RunStatus.PAUSED):
        await append_events(conn, run_id, [NewEvent("run.cancelled", reason)])
        await conn.execute(
            "UPDATE approvals SET status = 'cancelled', decided_by = %s,"
            " decided_at = now(), decision_reason = 'the run was cancelled'"
            " WHERE run_id = %s AND status = 'pending'",
            (by, run_id),
        )
    elif status in (RunStatus.RUNNING, RunStatus.WAITING_TOOL):
        await conn.execute(
            "UPDATE runs SET cancel_requested = true, updated_at = now() WHERE id = %s",
            (run_id,),
        )
        await conn.execute("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, run_id))
    else:
        raise RunFinishedError(run_id, status)


async def request_cancel(pool: Pool, who: Principal, run_id: str) -> dict[str, Any]:
    """Cancel a run: at once when no worker holds it, else ask its worker to stop.

    A run waiting for approval is cancelled at once and its pending approvals are closed.

    Raises:
        RunNotFoundError: no such run for this tenant.
        RunFinishedError: the run already ended (the API answers 409).
    """

    async def attempt() -> dict[str, Any]:
        async with pool.connection() as conn:
            async with conn.transaction():
                cur = await conn.execute(
                    "SELECT status FROM runs WHERE id = %s AND tenant_id = %s FOR NO KEY UPDATE",
                    (run_id, who.tenant_id),
                )
                row = await cur.fetchone()
                if row is None:
                    raise RunNotFoundError(run_id)
                await cancel_locked(conn, run_id, RunStatus(row["status"]), who.user_id)
            return await get_run(conn, who, run_id)

    return await retry_deadlocks(attempt)
