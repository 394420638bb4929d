"""The plan: the steps of a long task and their status, kept in the graph state.

A plan is a small JSON value, `{"runId", "revision", "steps": [{"id", "title", "status",
"notes"}]}`, so it travels unchanged through checkpoints, events and the snapshot. Every
function here is pure: it returns a new plan and never changes the one it is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

StepStatus = Literal["pending", "running", "done", "failed", "skipped"]
STEP_STATUSES: tuple[str, ...] = get_args(StepStatus)
OPEN_STATUSES = frozenset({"pending", "running"})
Plan = dict[str, Any]
Change = dict[str, Any]
MAX_STEPS = 50
MAX_TITLE = 300
MAX_NOTES = 2_000
_MARKS = {"pending": "[ ]", "running": "[>]", "done": "[x]", "failed": "[!]", "skipped": "[-]"}


class PlanError(ValueError):
    """An update the plan cannot take; the message tells the model what to do instead."""


def empty_plan(run_id: str) -> Plan:
    """Return a run's plan before it has any step."""
    return {"runId": run_id, "revision": 0, "steps": []}


def plan_of(value: Any, run_id: str | None) -> Plan | None:
    """Return the plan in `value` if it belongs to run `run_id` (a new run starts with none)."""
    if isinstance(value, Mapping) and value.get("steps") and value.get("runId") == run_id:
        return dict(value)
    return None


def _step(raw: Any, position: int) -> dict[str, Any]:
    if isinstance(raw, str):
        raw = {"title": raw}
    if not isinstance(raw, Mapping):
        raise PlanError(f"step {position} must be an object with a title (or a title string)")
    title = str(raw.get("title") or "").strip()
    if not title or len(title) > MAX_TITLE:
        raise PlanError(f"step {position} needs a title of 1-{MAX_TITLE} characters")
    status = raw.get("status") or "pending"
    if status not in STEP_STATUSES:
        raise PlanError(f"step {position}: status must be one of {', '.join(STEP_STATUSES)}")
    step_id = str(raw.get("id") or position).strip()
    notes = str(raw.get("notes") or "")[:MAX_NOTES]
    return {"id": step_id, "title": title, "status": status, "notes": notes}


def parse_steps(steps: Sequence[Any] | None) -> list[dict[str, Any]]:
    """Check a list of steps; ids default to the step's position (1, 2, ...)."""
    if not steps:
        raise PlanError("give the plan's steps: a list of {title, status?, notes?, id?}")
    if len(steps) > MAX_STEPS:
        raise PlanError(f"a plan has at most {MAX_STEPS} steps; group the small ones")
    parsed = [_step(raw, i) for i, raw in enumerate(steps, start=1)]
    ids = [s["id"] for s in parsed]
    if len(set(ids)) != len(ids):
        raise PlanError("step ids must be unique")
    return parsed


def update_plan(
    plan: Plan | None,
    run_id: str,
    action: str,
    *,
    steps: Sequence[Any] | None = None,
    step_id: str | None = None,
    status: str | None = None,
    notes: str | None = None,
) -> Plan:
    """Return the plan after `action`: `create`, `replace`, or `mark` one step.

    Raises:
        PlanError: the action does not fit the plan (the message says what would).
    """
    current = plan or empty_plan(run_id)
    if action == "create":
        if current["steps"]:
            raise PlanError(
                "a plan already exists: use action 'mark' to update a step, or 'replace' to "
                "write a new list of steps"
            )
        new_steps = parse_steps(steps)
    elif action == "replace":
        new_steps = parse_steps(steps)
    elif action == "mark":
        new_steps = _marked(current, step_id, status, notes)
    else:
        raise PlanError(f"action must be 'create', 'replace' or 'mark', not {action!r}")
    return {"runId": run_id, "revision": int(current["revision"]) + 1, "steps": new_steps}


def _marked(
    plan: Plan, step_id: str | None, status: str | None, notes: str | None
) -> list[dict[str, Any]]:
    if not plan["steps"]:
        raise PlanError("there is no plan yet: call update_plan with action 'create' first")
    ids = [s["id"] for s in plan["steps"]]
    if step_id is None or str(step_id) not in ids:
        raise PlanError(f"step_id must be one of the plan's step ids: {', '.join(ids)}")
    if status is None and notes is None:
        raise PlanError("give the step's new status, its notes, or both")
    if status is not None and status not in STEP_STATUSES:
        raise PlanError(f"status must be one of {', '.join(STEP_STATUSES)}")
    out = []
    for step in plan["steps"]:
        if step["id"] == str(step_id):
            step = {**step, "status": status or step["status"]}
            if notes is not None:
                step["notes"] = notes[:MAX_NOTES]
        out.append(dict(step))
    return out


def changes(old: Plan | None, new: Plan) -> list[Change]:
    """Return what differs between two plans, step by step (added, removed, changed fields)."""
    before = {s["id"]: s for s in (old or {}).get("steps", [])}
    after = {s["id"]: s for s in new.get("steps", [])}
    found: list[Change] = []
    for step_id, step in after.items():
        prior = before.get(step_id)
        if prior is None:
            found.append({"id": step_id, "change": "added", "to": step["status"]})
            continue
        for key in ("status", "title", "notes"):
            if prior.get(key) != step.get(key):
                found.append(
                    {"id": step_id, "change": key, "from": prior.get(key), "to": step[key]}
                )
    found += [{"id": i, "change": "removed"} for i in before if i not in after]
    return found


def close_plan(plan: Plan, outcome: Literal["failed", "cancelled"]) -> Plan | None:
    """Return the plan as a run's end leaves it, or None when nothing changes.

    A failed run marks its running steps failed; a cancelled run marks every step still
    pending or running skipped.
    """

    def closed(status: str) -> str:
        if outcome == "failed":
            return "failed" if status == "running" else status
        return "skipped" if status in OPEN_STATUSES else status

    steps = [{**s, "status": closed(s["status"])} for s in plan.get("steps", [])]
    if steps == plan.get("steps"):
        return None
    return {**plan, "revision": int(plan.get("revision", 0)) + 1, "steps": steps}


def running_step(plan: Plan | None) -> dict[str, Any] | None:
    """Return the first running step of the plan, if any."""
    for step in (plan or {}).get("steps", []):
        if step["status"] == "running":
            return dict(step)
    return None


def render(plan: Plan) -> str:
    """Return the plan as the model reads it: one line per step, with its status and notes."""
    lines = []
    for step in plan["steps"]:
        line = f"{_MARKS[step['status']]} {step['id']}. {step['title']} ({step['status']})"
        if step.get("notes"):
            line += f" - {step['notes']}"
        lines.append(line)
    return "\n".join(lines)
