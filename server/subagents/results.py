"""A parent's recorded delegations, and how each one ended as the parent is told it."""

from __future__ import annotations

from typing import Any

from graphs.events import SubagentCompleted
from graphs.subagent import ChildResult
from nodes.models.usage import RunTotals
from server.db.pool import Conn
from server.domain import is_terminal
from server.subagents.usage import tree_usage

SUMMARY_CHARS = 500

_ROWS = """
SELECT s.*, r.status AS child_status, r.error_type AS child_error_type,
       r.error_message AS child_error,
       (SELECT content FROM messages WHERE id = r.output_message_id) AS child_output
FROM subagent_calls s LEFT JOIN runs r ON r.id = s.child_run_id
WHERE s.parent_run_id = %s
"""


async def delegation_rows(conn: Conn, parent_id: str) -> dict[str, dict[str, Any]]:
    """Return the parent's delegations by tool call id, with their current child's outcome.

    A finished child's row carries `tree_usage`: its totals with its own descendants'.
    """
    cur = await conn.execute(_ROWS, (parent_id,))
    rows = {row["tool_call_id"]: dict(row) for row in await cur.fetchall()}
    for row in rows.values():
        if ended(row) and row["child_run_id"] is not None:
            totals, _ = await tree_usage(conn, row["child_run_id"])
            row["tree_usage"] = totals.to_json()
    return rows


def ended(row: dict[str, Any]) -> bool:
    """Say whether the delegation is over: refused, or its child run is finished."""
    return row["child_run_id"] is None or is_terminal(row["child_status"])


def _status(row: dict[str, Any]) -> str:
    return "refused" if row["child_run_id"] is None else str(row["child_status"])


def _error(row: dict[str, Any]) -> str | None:
    if row["child_run_id"] is None:
        return str(row["refusal"])
    if row["child_status"] == "completed":
        return None
    return row["child_error"] or f"the subagent run was {row['child_status']}"


def completed_event(row: dict[str, Any]) -> SubagentCompleted:
    """Return the parent's `subagent.completed` event for a delegation that is over."""
    output = row["child_output"] or ""
    return {
        "toolCallId": row["tool_call_id"],
        "childRunId": row["child_run_id"],
        "agent": row["agent"],
        "status": _status(row),
        "summary": output[:SUMMARY_CHARS],
        "error": _error(row),
        "usage": row.get("tree_usage") or RunTotals().to_json(),
    }


def child_result(row: dict[str, Any]) -> ChildResult:
    """Return what the parent's `delegate` call resumes with for a delegation that is over."""
    return {
        "status": _status(row),
        "childRunId": row["child_run_id"],
        "output": row["child_output"] or "",
        "error": _error(row),
        "usage": row.get("tree_usage") or RunTotals().to_json(),
    }
