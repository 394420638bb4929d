"""The plan in the snapshot: its fold, the execution view, and how a run's end closes it.

The execution view joins the plan's running step with what the runtime is doing now (the
run's status, the tools it waits on, the approvals it waits for), so a UI shows both
without logic of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphs.events import EventType
from tools.plan.model import changes, close_plan, running_step

Snapshot = dict[str, Any]
# The final events that close a plan's open steps, and how.
CLOSING: dict[str, str] = {EventType.RUN_FAILED: "failed", EventType.RUN_CANCELLED: "cancelled"}


def fold_plan(snap: Snapshot, data: Mapping[str, Any]) -> None:
    """Fold `plan.updated`: the snapshot carries the whole plan."""
    snap["plan"] = data["plan"]


def execution_view(snap: Snapshot) -> dict[str, Any]:
    """Return the plan's running step beside the run's status and what it waits on."""
    status = snap["status"]
    plan = snap.get("plan")
    step = running_step(plan)
    waiting_on: dict[str, Any] | None = None
    if status == "waiting_tool":
        names = [t["name"] for t in snap["toolCalls"] if t["status"] == "running"]
        waiting_on = {"kind": "tool", "names": names}
    elif status == "waiting_user":
        names = [a["name"] for a in snap.get("approvals", []) if a["status"] == "pending"]
        waiting_on = {"kind": "approval", "names": names}
    text = f"run {status}"
    if waiting_on is not None and waiting_on["names"]:
        text += f" on {', '.join(waiting_on['names'])}"
    if step is not None:
        text = f"step {step['id']} ({step['title']}) running; {text}"
    return {
        "status": status,
        "step": None if step is None else {"id": step["id"], "title": step["title"]},
        "waitingOn": waiting_on,
        "planRevision": (plan or {}).get("revision", 0),
        "text": text,
    }


def closing_update(snap: Snapshot, kind: str) -> dict[str, Any] | None:
    """Return the `plan.updated` data a final event implies (open steps closed), if any."""
    how = CLOSING.get(kind)
    plan = snap.get("plan")
    if how is None or not plan:
        return None
    closed = close_plan(plan, how)  # type: ignore[arg-type]
    if closed is None:
        return None
    return {"plan": closed, "changed": changes(plan, closed), "reason": str(kind)}
