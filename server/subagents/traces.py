"""A parent's trace with each child run's trace as a subtree of its root span."""

from __future__ import annotations

from typing import Any

from server.db.pool import Conn
from server.domain import Run
from server.observability.traces import load_trace

# A parent's children, and theirs, are read to this depth at most (AGENTRT_SUBAGENT_MAX_DEPTH
# is lower; this only bounds a hand-edited database).
MAX_DEPTH = 10


async def with_children(
    conn: Conn, trace: dict[str, Any], run: Run, depth: int = 0
) -> dict[str, Any]:
    """Hang each child run's span tree under the root span of `trace` (the run's), recursively."""
    if depth >= MAX_DEPTH:
        return trace
    cur = await conn.execute(
        "SELECT * FROM runs WHERE parent_run_id = %s ORDER BY created_at, id", (run.id,)
    )
    for row in await cur.fetchall():
        child = Run.from_row(row)
        subtree = await with_children(conn, await load_trace(conn, child), child, depth + 1)
        root = subtree["root"]
        root["name"] = f"subagent {child.agent_name}"
        root["attributes"] = {
            **root["attributes"],
            "agentrt.run_id": child.id,
            "agentrt.parent_run_id": run.id,
            "agentrt.trace_id": subtree["traceId"],
        }
        trace["root"]["children"].append(root)
        trace["spanCount"] += subtree["spanCount"]
    return trace
