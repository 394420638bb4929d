"""The `plan` section: the run's own plan, so the model still sees it after old turns go."""

from __future__ import annotations

from nodes.context.sections import ORDER_PLAN, SectionItems, SectionRequest, SectionSpec
from nodes.state_tools import current_plan, plan_options
from tools.plan.model import render

PLAN_HEADING = (
    "<plan>\nYour plan for this task. Mark each step running when you start it and done when "
    "it ends (update_plan)."
)
NO_PLAN = (
    "No plan yet. This agent requires one: call update_plan with action 'create' before "
    "tool call number {n}."
)
DEFAULT_PLAN_BUDGET = 800


async def plan_section(request: SectionRequest) -> list[str]:
    """Show the current plan; when the profile requires one and there is none, say so."""
    plan = current_plan(request.state)
    if plan is None:
        options = plan_options(request.options)
        if options.get("required"):
            return [NO_PLAN.format(n=options.get("requiredBeforeToolCall") or 2)]
        return []
    return SectionItems(
        [render(plan)], [{"revision": plan["revision"], "steps": len(plan["steps"])}]
    )


PLAN_SECTION = SectionSpec(
    "plan",
    plan_section,
    ORDER_PLAN,
    85,
    budget=DEFAULT_PLAN_BUDGET,
    frame=(PLAN_HEADING, "</plan>"),
)
