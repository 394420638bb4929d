"""The API's rendering of conversations, messages and runs (camelCase JSON objects)."""

from __future__ import annotations

from typing import Any

from server.domain import Run
from server.timestamps import iso


def conversation_view(row: dict[str, Any]) -> dict[str, Any]:
    """Render a conversation row for the API."""
    return {
        "conversationId": row["id"],
        "title": row["title"],
        "model": row["model"],
        "agent": row["agent"],
        "metadata": row["metadata"],
        "userId": row["user_id"],
        "createdAt": iso(row["created_at"]),
    }


def message_view(row: dict[str, Any]) -> dict[str, Any]:
    """Render a message row for the API."""
    return {
        "messageId": row["id"],
        "conversationId": row["conversation_id"],
        "runId": row["run_id"],
        "role": row["role"],
        "content": row["content"],
        "createdAt": iso(row["created_at"]),
    }


def run_view(run: Run) -> dict[str, Any]:
    """Render a run for the API."""
    error = None
    if run.error_type:
        error = {
            "type": run.error_type,
            "message": run.error_message,
            **(run.error_details or {}),
        }
    return {
        "runId": run.id,
        "conversationId": run.conversation_id,
        "userId": run.user_id,
        "status": run.status.value,
        "model": run.model,
        "agent": {"name": run.agent_name, "version": run.agent_version},
        "options": run.options,
        "inputMessageId": run.input_message_id,
        "outputMessageId": run.output_message_id,
        "attempt": run.attempt,
        "error": error,
        "lastEventId": run.last_event_seq,
        "usage": run.usage,
        "cancelRequested": run.cancel_requested,
        "pauseRequested": run.pause_requested and not run.is_terminal,
        "pausedAt": iso(run.paused_at),
        "leaseOwner": run.lease_owner,
        "recoveries": run.recoveries,
        "createdAt": iso(run.created_at),
        "startedAt": iso(run.started_at),
        "finishedAt": iso(run.finished_at),
        "parentRunId": run.parent_run_id,
        "depth": run.depth,
        "notBefore": iso(run.not_before),
    }


def accepted_view(
    run_id: str,
    status: str,
    conversation_id: str,
    message_id: str,
    model: str,
    agent: tuple[str, int],
    model_source: str | None,
) -> dict[str, Any]:
    """Render the answer to a posted message from its new run."""
    return {
        "runId": run_id,
        "status": status,
        "conversationId": conversation_id,
        "messageId": message_id,
        "model": model,
        "modelSource": model_source,
        "agent": {"name": agent[0], "version": agent[1]},
        "streamUrl": f"/api/runs/{run_id}/events",
        "snapshotUrl": f"/api/runs/{run_id}/snapshot",
    }
