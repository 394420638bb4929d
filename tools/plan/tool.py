"""The `update_plan` tool: the model writes and follows its own plan (tools/plan/model.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from langchain_core.tools import ToolException
from pydantic import BaseModel, Field

from tools.plan.model import PlanError, changes, render
from tools.plan.model import update_plan as apply_update
from tools.run_state import current_view
from tools.spec import agent_tool

PLAN_TOOLS = ("update_plan",)


class StepInput(BaseModel):
    """One step of a plan, as the model writes it."""

    title: str = Field(description="What the step does, in a few words.")
    id: str | None = Field(default=None, description="Short id; defaults to its position.")
    status: Literal["pending", "running", "done", "failed", "skipped"] = "pending"
    notes: str = ""


def plan_arguments(args: Mapping[str, Any]) -> dict[str, Any]:
    """Return an `update_plan` call's arguments as plain values (steps as dicts)."""
    steps = args.get("steps")
    plain = [s.model_dump() if isinstance(s, BaseModel) else s for s in steps or []]
    return {
        "action": args.get("action"),
        "steps": plain or None,
        "step_id": None if args.get("step_id") is None else str(args["step_id"]),
        "status": args.get("status"),
        "notes": args.get("notes"),
    }


@agent_tool(idempotent=True)
async def update_plan(
    action: Literal["create", "replace", "mark"],
    steps: list[StepInput] | None = None,
    step_id: str | None = None,
    status: Literal["pending", "running", "done", "failed", "skipped"] | None = None,
    notes: str | None = None,
) -> str:
    """Write or update your plan for a task that takes several steps.

    Create the plan before you start (action "create" with the steps), mark each step
    "running" when you start it and "done" (or "failed", "skipped") when it ends (action
    "mark" with step_id and status, and notes on what you found), and use "replace" when the
    plan itself must change. The current plan is shown in your system prompt under <plan>.

    Args:
        action: create (a first plan), replace (a new list of steps), or mark (one step).
        steps: For create and replace: the steps in order.
        step_id: For mark: the id of the step to update.
        status: For mark: the step's new status.
        notes: For mark: what the step found or why it failed (optional).
    """
    view = current_view()
    options = view.options.get("plan") or {}
    if not options.get("enabled"):
        raise ToolException("plans are off for this agent")
    arguments = plan_arguments(
        {"action": action, "steps": steps, "step_id": step_id, "status": status, "notes": notes}
    )
    async with view.lock:
        try:
            new = apply_update(view.plan, view.run_id, **arguments)
        except PlanError as exc:
            raise ToolException(str(exc)) from exc
        changed = changes(view.plan, new)
        view.plan = new
    return json.dumps({"plan": new, "changed": changed, "text": render(new)})
