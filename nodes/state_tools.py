"""Skills and the plan in the graph: what the tools see, what they change, what they narrow.

`load_skill` and `update_plan` run through the tool pipeline and its ledger like any tool;
the state they change is derived here from the turn's recorded results, in call order, so a
replay after a crash derives the same state again. A loaded skill's `allowed-tools` narrow
the tools for the rest of the run (never beyond what the toolbox allows), and a profile that
requires a plan refuses tool calls past the limit until there is one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import BaseTool

from graphs.context import RunContext
from graphs.events import Emit, EventType, SkillLoaded
from graphs.state import AgentState
from nodes.skill_select import best_match
from skills.library import SkillUnavailableError
from skills.tools import LOADED_NOTE, SKILL_TOOLS, loaded_record, skill_options
from tools.errors import ToolCallError
from tools.pipeline import ToolResult
from tools.plan.model import PlanError, changes, plan_of, update_plan
from tools.plan.tool import PLAN_TOOLS, plan_arguments
from tools.policy import PreparedCall
from tools.run_state import RunStateView

# Always offered when their feature is on: a skill's tool list never hides them.
RUNTIME_TOOLS = frozenset({*SKILL_TOOLS, *PLAN_TOOLS})


def section_options(context: RunContext) -> Mapping[str, Any]:
    """Return the profile's section options of the run (skills, plan, memory...)."""
    options = getattr(context.context_setup, "section_options", None)
    return options if isinstance(options, Mapping) else {}


def plan_options(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """Return the run's plan settings."""
    found = options.get("plan")
    return found if isinstance(found, Mapping) else {}


def current_plan(state: Mapping[str, Any]) -> dict[str, Any] | None:
    """Return the current run's plan (a plan of an earlier run is not this run's)."""
    return plan_of(state.get("plan"), state.get("run_id"))


def loaded_skills(state: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Return the skills the current run loaded, by name."""
    found = state.get("skills")
    if isinstance(found, Mapping) and found.get("runId") == state.get("run_id"):
        return dict(found.get("loaded") or {})
    return {}


def tool_scope(loaded: Mapping[str, Mapping[str, Any]]) -> frozenset[str] | None:
    """Return the tools the loaded skills allow (all they name), or None when none narrows."""
    lists = [s["allowedTools"] for s in loaded.values() if s.get("allowedTools") is not None]
    if not lists:
        return None
    return frozenset(name for names in lists for name in names) | RUNTIME_TOOLS


def visible_tools(state: Mapping[str, Any], tools: Sequence[BaseTool]) -> list[BaseTool]:
    """Return the tools the model is shown, narrowed by the skills the run loaded."""
    scope = tool_scope(loaded_skills(state))
    return list(tools) if scope is None else [t for t in tools if t.name in scope]


def state_view(state: Mapping[str, Any], context: RunContext) -> RunStateView:
    """Return what this turn's tools see of the run's state."""
    return RunStateView(
        run_id=context.run_id,
        plan=current_plan(state),
        skills=loaded_skills(state),
        options=section_options(context),
    )


def _prior_tool_calls(messages: Sequence[Any]) -> int:
    """Count the tool calls this run answered so far (since its user message)."""
    count = 0
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            break
        count += isinstance(message, ToolMessage)
    return count


def refusals(
    state: AgentState, calls: Sequence[PreparedCall], context: RunContext
) -> dict[str, ToolCallError]:
    """Return the calls refused by a loaded skill's tool list or by a required plan."""
    out: dict[str, ToolCallError] = {}
    loaded = loaded_skills(state)
    scope = tool_scope(loaded)
    plan = plan_options(section_options(context))
    required_at = int(plan.get("requiredBeforeToolCall") or 2) if plan.get("required") else None
    has_plan = current_plan(state) is not None
    prior = _prior_tool_calls(state["messages"])
    for index, call in enumerate(calls):
        if call.error is not None or call.name in RUNTIME_TOOLS:
            has_plan = has_plan or call.name == "update_plan"
            continue
        if scope is not None and call.name not in scope:
            names = ", ".join(sorted(loaded))
            out[call.call_id] = ToolCallError(
                "forbidden",
                f"{call.name} is not among the tools the loaded skill(s) {names} allow "
                f"({', '.join(sorted(scope - RUNTIME_TOOLS)) or 'none'}); use one of those",
            )
        elif required_at is not None and not has_plan and prior + index + 1 >= required_at:
            out[call.call_id] = ToolCallError(
                "forbidden",
                f"this agent must make a plan before tool call number {required_at}: call "
                "update_plan with action 'create' and the task's steps, then call "
                f"{call.name} again",
            )
    return out


def _plan_update(
    state: AgentState, calls: Sequence[PreparedCall], results: Mapping[str, ToolResult], emit: Emit
) -> dict[str, Any]:
    start = current_plan(state)
    plan, applied = start, []
    run_id = str(state.get("run_id") or "")
    for call in calls:
        result = results[call.call_id]
        if call.name != "update_plan" or result.status != "completed":
            continue
        try:
            plan = update_plan(plan, run_id, **plan_arguments(call.args))
        except PlanError:
            continue  # the tool validated it against another order of the turn's calls
        applied.append(call.call_id)
    if plan is None or plan is start:
        return {}
    emit(
        {
            "event": EventType.PLAN_UPDATED,
            "plan": plan,
            "changed": changes(start, plan),
            "reason": "tool",
            "toolCallIds": applied,
        }
    )
    return {"plan": plan}


def _skills_update(
    state: AgentState, calls: Sequence[PreparedCall], results: dict[str, ToolResult], emit: Emit
) -> dict[str, Any]:
    loaded = loaded_skills(state)
    added = False
    for call in calls:
        result = results[call.call_id]
        if call.name != "load_skill" or result.status != "completed":
            continue
        try:
            record = json.loads(result.output)["loaded"]
        except (ValueError, KeyError, TypeError):
            continue
        # The model reads a short note; the instructions go into the system prompt.
        result.output = json.dumps(
            {k: v for k, v in record.items() if k != "instructions"}
            | {"note": LOADED_NOTE.format(**record)}
        )
        if record["name"] in loaded:
            continue
        loaded[record["name"]] = record
        added = True
        emit(skill_loaded_event(record, call.call_id))
    if not added:
        return {}
    return {"skills": {"runId": state.get("run_id"), "loaded": loaded}}


def skill_loaded_event(record: Mapping[str, Any], tool_call_id: str | None) -> SkillLoaded:
    """Return the `skill.loaded` event of a loaded skill (its instructions left out)."""
    event: SkillLoaded = {
        "event": EventType.SKILL_LOADED,
        "name": record["name"],
        "version": record["version"],
        "label": record["label"],
        "hash": record["hash"],
        "owner": record["owner"],
        "allowedTools": record["allowedTools"],
        "resources": record["resources"],
        "via": record["via"],
        "toolCallId": tool_call_id,
    }
    if "similarity" in record:
        event["similarity"] = record["similarity"]
    return event


def apply_results(
    state: AgentState, calls: Sequence[PreparedCall], results: dict[str, ToolResult], emit: Emit
) -> dict[str, Any]:
    """Return the state the turn's plan and skill calls leave, and emit their events."""
    return {
        **_plan_update(state, calls, results, emit),
        **_skills_update(state, calls, results, emit),
    }


async def preload(state: AgentState, context: RunContext, emit: Emit) -> dict[str, Any]:
    """Load the profile's preloaded skills (and the best match, if asked) at the first call.

    A preloaded skill the run cannot load (disabled, removed) is left out; the `skills`
    section then lists what the run can load instead.
    """
    options = skill_options(section_options(context))
    names = [n for n in options.get("preload") or () if isinstance(n, str)]
    auto = options.get("autoSelect") or {}
    library = options.get("library")
    if library is None or state.get("step", 0) != 0 or loaded_skills(state):
        return {}
    loaded: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            entry = await library.get(name)
        except SkillUnavailableError:
            continue
        loaded[name] = loaded_record(entry, "preload")
    if auto.get("enabled") and not loaded:
        match = best_match(state["messages"], await library.available(), auto)
        if match is not None:
            summary, score = match
            entry = await library.get(summary.name)
            loaded[entry.skill.name] = loaded_record(entry, "auto") | {
                "similarity": round(score, 4)
            }
    for record in loaded.values():
        emit(skill_loaded_event(record, None))
    if not loaded:
        return {}
    return {"skills": {"runId": state.get("run_id"), "loaded": loaded}}
