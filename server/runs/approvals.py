"""Approval records: a run's LangGraph interrupt becomes rows a reviewer decides on.

The executor calls `suspend` when the graph stops on an interrupt (rows + `approval.required`
events, run -> waiting_user, lease released) and `resume_command` when a re-queued run has all
its decisions (-> `Command(resume=...)`). `decide` records a reviewer's decision with an
`approval.resolved` event; the last decision of a run moves it to queued and wakes workers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from langgraph.types import Command, Interrupt
from psycopg.types.json import Jsonb

from graphs.approval import (
    ApprovalCall,
    ApprovalResume,
    CallDecision,
    Decision,
    request_calls,
    request_kind,
)
from graphs.events import EventType
from server.auth import Principal
from server.db.pool import Conn, Pool
from server.domain import Run
from server.errors import ApprovalDecidedError, ApprovalForbiddenError, ApprovalNotFoundError
from server.events.log import NewEvent, RunHead, append_events
from server.events.writer import EventWriter
from server.lifecycle import audit
from server.runs.records import get_run
from server.timestamps import iso
from tools.validation import redact

STATUS_BY_DECISION = {"approve": "approved", "reject": "rejected", "edit": "edited"}
DECISION_BY_STATUS: dict[str, Decision] = {
    "approved": "approve",
    "edited": "edit",
    "rejected": "reject",
    "expired": "reject",
    "cancelled": "reject",
}


def approval_id(run_id: str, interrupt_id: str, tool_call_id: str) -> str:
    """Return the id of the approval for one call of one interrupt (the same on every retry)."""
    digest = hashlib.sha256(f"{run_id}\x00{interrupt_id}\x00{tool_call_id}".encode()).hexdigest()
    return f"apr_{digest[:32]}"


def approval_view(row: dict[str, Any]) -> dict[str, Any]:
    """Render an approval row for the API (arguments redacted)."""
    keys = row["redact"] or []
    decision = None
    if row["status"] != "pending":
        decision = {
            "decision": DECISION_BY_STATUS.get(row["status"]),
            "by": row["decided_by"],
            "at": iso(row["decided_at"]),
            "reason": row["decision_reason"],
            "args": redact(row["edited_args"], keys) if row["edited_args"] is not None else None,
        }
    return {
        "approvalId": row["id"],
        "runId": row["run_id"],
        "conversationId": row["conversation_id"],
        "kind": row["kind"],
        "toolCallId": row["tool_call_id"],
        "tool": row["tool_name"],
        "args": redact(row["args"], keys),
        "risk": row["risk"],
        "source": row["source"],
        "reason": row["reason"],
        "status": row["status"],
        "decision": decision,
        "requestedAt": iso(row["requested_at"]),
        "expiresAt": iso(row["expires_at"]),
    }


async def _rows_for(conn: Conn, run_id: str, interrupt_ids: Sequence[str]) -> dict[str, Any]:
    cur = await conn.execute(
        "SELECT * FROM approvals WHERE run_id = %s AND interrupt_id = ANY(%s)",
        (run_id, list(interrupt_ids)),
    )
    return {r["id"]: r for r in await cur.fetchall()}


async def resume_command(
    pool: Pool, run_id: str, interrupts: Sequence[Interrupt]
) -> Command[Any] | None:
    """Return `Command(resume=...)` when every call of every interrupt is decided, else None."""
    async with pool.connection() as conn:
        rows = await _rows_for(conn, run_id, [i.id for i in interrupts])
    resume: dict[str, ApprovalResume] = {}
    for intr in interrupts:
        decisions: dict[str, CallDecision] = {}
        for call in request_calls(intr.value):
            row = rows.get(approval_id(run_id, intr.id, call["toolCallId"]))
            if row is None or row["status"] == "pending":
                return None
            decisions[call["toolCallId"]] = {
                "decision": DECISION_BY_STATUS[row["status"]],
                "args": row["edited_args"],
                "reason": row["decision_reason"],
                "by": row["decided_by"],
                "approvalId": row["id"],
            }
        resume[intr.id] = {"decisions": decisions}
    return Command(resume=resume)


@dataclass(frozen=True)
class _Request:
    """One call of one interrupt that still waits for a reviewer."""

    id: str
    interrupt_id: str
    kind: str
    call: ApprovalCall
    expires_at: datetime | None
    stored: bool  # its row exists already (an earlier attempt asked)

    def event(self) -> NewEvent:
        """The `approval.required` event that asks for this call's decision."""
        call = self.call
        return NewEvent(
            EventType.APPROVAL_REQUIRED,
            {
                "approvalId": self.id,
                "kind": self.kind,
                "toolCallId": call["toolCallId"],
                "name": call["name"],
                "args": redact(call.get("args", {}), call.get("redact", [])),
                "risk": call.get("risk"),
                "source": call.get("source"),
                "reason": call.get("reason", ""),
                "expiresAt": iso(self.expires_at),
            },
        )


def _pending_requests(
    run_id: str, interrupts: Sequence[Interrupt], existing: dict[str, Any]
) -> list[_Request]:
    """The calls of `interrupts` not yet decided; a stored row keeps its expiry."""
    now = datetime.now(UTC)
    requests = []
    for intr in interrupts:
        kind = request_kind(intr.value)
        for call in request_calls(intr.value):
            aid = approval_id(run_id, intr.id, call["toolCallId"])
            row = existing.get(aid)
            if row is not None and row["status"] != "pending":
                continue
            timeout = call.get("timeoutS")
            if row is not None:
                expires = row["expires_at"]
            else:
                expires = now + timedelta(seconds=float(timeout)) if timeout else None
            requests.append(_Request(aid, intr.id, kind, call, expires, stored=row is not None))
    return requests


async def _insert_request(conn: Conn, run: Run, request: _Request) -> None:
    call = request.call
    await conn.execute(
        "INSERT INTO approvals (id, tenant_id, run_id, conversation_id, interrupt_id, kind,"
        " tool_call_id, tool_name, args, redact, risk, source, reason, expires_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (run_id, interrupt_id, tool_call_id) DO NOTHING",
        (
            request.id,
            run.tenant_id,
            run.id,
            run.conversation_id,
            request.interrupt_id,
            request.kind,
            call["toolCallId"],
            call["name"],
            Jsonb(call.get("args", {})),
            list(call.get("redact", [])),
            call.get("risk"),
            call.get("source"),
            call.get("reason", ""),
            request.expires_at,
        ),
    )


async def suspend(
    pool: Pool, writer: EventWriter, run: Run, interrupts: Sequence[Interrupt]
) -> None:
    """Store the approval rows of `interrupts` and their `approval.required` events, atomically.

    The events move the run to waiting_user, which releases its lease: no worker holds it
    while it waits. Rows that exist already (a retry) are kept; decided ones are not asked
    again.
    """
    async with pool.connection() as conn:
        existing = await _rows_for(conn, run.id, [i.id for i in interrupts])
    requests = _pending_requests(run.id, interrupts, existing)

    async def insert(conn: Conn, head: RunHead) -> None:
        for request in requests:
            if not request.stored:
                await _insert_request(conn, run, request)

    await writer.commit([r.event() for r in requests], insert)


async def get_approval(pool: Pool, who: Principal, approval_id: str) -> dict[str, Any]:
    """Return the tenant's approval or raise ApprovalNotFoundError."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT * FROM approvals WHERE id = %s AND tenant_id = %s", (approval_id, who.tenant_id)
        )
        row = await cur.fetchone()
    if row is None:
        raise ApprovalNotFoundError(approval_id)
    return row


async def list_approvals(
    pool: Pool, who: Principal, status: str | None, limit: int
) -> list[dict[str, Any]]:
    """List the tenant's approvals, oldest request first, optionally of one status."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT * FROM approvals WHERE tenant_id = %s AND (%s::text IS NULL OR status = %s)"
            " ORDER BY requested_at, run_id, tool_call_id LIMIT %s",
            (who.tenant_id, status, status, limit),
        )
        return await cur.fetchall()


async def run_approvals(pool: Pool, who: Principal, run_id: str) -> list[dict[str, Any]]:
    """List one run's approvals in request order."""
    async with pool.connection() as conn:
        await get_run(conn, who, run_id)
        cur = await conn.execute(
            "SELECT * FROM approvals WHERE run_id = %s ORDER BY requested_at, tool_call_id",
            (run_id,),
        )
        return await cur.fetchall()


async def resolve(
    conn: Conn,
    approval_id: str,
    *,
    status: str,
    by: str,
    reason: str | None,
    edited_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Record a decision and its `approval.resolved` event in the caller's transaction.

    Locks the run row before the approval row (the order `request_cancel` uses too).

    Raises:
        ApprovalDecidedError: the approval is no longer pending.
    """
    cur = await conn.execute("SELECT run_id FROM approvals WHERE id = %s", (approval_id,))
    found = await cur.fetchone()
    if found is None:
        raise ApprovalNotFoundError(approval_id)
    await conn.execute("SELECT 1 FROM runs WHERE id = %s FOR NO KEY UPDATE", (found["run_id"],))
    cur = await conn.execute("SELECT * FROM approvals WHERE id = %s FOR UPDATE", (approval_id,))
    row = await cur.fetchone()
    assert row is not None
    if row["status"] != "pending":
        raise ApprovalDecidedError(approval_id, row["status"])
    cur = await conn.execute(
        "UPDATE approvals SET status = %s, decision_reason = %s, edited_args = %s,"
        " decided_by = %s, decided_at = now() WHERE id = %s RETURNING *",
        (
            status,
            reason,
            Jsonb(edited_args) if edited_args is not None else None,
            by,
            approval_id,
        ),
    )
    updated = await cur.fetchone()
    assert updated is not None
    await append_events(conn, row["run_id"], [_resolved_event(updated)])
    return updated


def _resolved_event(row: dict[str, Any]) -> NewEvent:
    """The `approval.resolved` event of an approval row just decided."""
    status, edited = row["status"], row["edited_args"]
    return NewEvent(
        EventType.APPROVAL_RESOLVED,
        {
            "approvalId": row["id"],
            "kind": row["kind"],
            "toolCallId": row["tool_call_id"],
            "name": row["tool_name"],
            "status": status,
            "decision": DECISION_BY_STATUS.get(status),
            "by": row["decided_by"],
            "reason": row["decision_reason"],
            "args": redact(edited, row["redact"] or []) if edited else None,
            "decidedAt": iso(row["decided_at"]),
        },
    )


async def decide(
    pool: Pool,
    who: Principal,
    approval_id: str,
    *,
    decision: str,
    reason: str | None,
    args: dict[str, Any] | None,
    check_args: Callable[[dict[str, Any], dict[str, Any]], Awaitable[dict[str, Any]]],
) -> dict[str, Any]:
    """Decide a pending approval as `who` (a reviewer of its tenant).

    Args:
        pool: The pool.
        who: The caller.
        approval_id: The approval.
        decision: approve, reject or edit.
        reason: Shown to the model on reject; recorded in every case.
        args: The edited arguments (edit only).
        check_args: Validates edited arguments against the tool's schema for this approval
            row and returns them normalised (raises on invalid ones).

    Raises:
        ApprovalNotFoundError: not in the caller's tenant (404).
        ApprovalForbiddenError: the caller lacks the reviewer role (403).
        ApprovalDecidedError: decided already (409).
    """
    row = await get_approval(pool, who, approval_id)
    if not who.has_role("reviewer"):
        raise ApprovalForbiddenError("deciding approvals needs the reviewer role")
    edited = await check_args(row, args or {}) if decision == "edit" else None
    async with pool.connection() as conn, conn.transaction():
        decided = await resolve(
            conn,
            approval_id,
            status=STATUS_BY_DECISION[decision],
            by=who.user_id,
            reason=reason,
            edited_args=edited,
        )
        await audit.record(
            conn,
            tenant_id=who.tenant_id,
            actor=who.user_id,
            action="approval.decided",
            target=approval_id,
            diff={"decision": decision, "tool": row["tool_name"], "runId": row["run_id"]},
        )
        return decided


async def expire_due(pool: Pool, limit: int = 100) -> int:
    """Resolve pending approvals past their `expires_at` as expired (the model sees a rejection)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT id FROM approvals WHERE status = 'pending' AND expires_at < now()"
            " ORDER BY expires_at LIMIT %s",
            (limit,),
        )
        due = [r["id"] for r in await cur.fetchall()]
    count = 0
    for aid in due:
        try:
            async with pool.connection() as conn, conn.transaction():
                await resolve(
                    conn,
                    aid,
                    status="expired",
                    by="system",
                    reason="nobody decided before the approval request expired",
                )
            count += 1
        except ApprovalDecidedError:
            continue
    return count
