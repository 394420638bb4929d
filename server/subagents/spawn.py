"""Start a parent's child runs when its graph stops on a subagent interrupt.

Each delegation is checked (depth, the per-parent limit, the profile, the tools, the budget
and time left), then recorded in `subagent_calls` with its child run and the parent's
`subagent.started` event in one transaction, fenced by the parent's lease. A replayed step
finds the recorded delegations and starts nothing again. The parent is left `waiting_tool`
and held by no worker until its last child ends (server/subagents/wake.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from psycopg.types.json import Jsonb

from graphs.events import EventType
from graphs.subagent import Delegation
from nodes.models.usage import RunTotals, money
from server.agents.runtime import tool_allow_list
from server.agents.store import AgentVersion, resolve_agent, run_agent
from server.db.pool import Conn, Pool
from server.domain import Run
from server.errors import UnknownAgentError
from server.events.log import NewEvent, RunHead
from server.events.writer import EventWriter
from server.runs.records import NewChildRun, insert_child_run
from server.settings import Settings
from server.subagents.results import completed_event, delegation_rows, ended
from server.subagents.usage import tree_usage
from server.usage.budgets import run_budget


@dataclass(frozen=True)
class _Start:
    """A delegation to record: the child to start, or why none is started."""

    delegation: Delegation
    agent: str
    child: NewChildRun | None
    refusal: str | None


def child_task(delegation: Delegation) -> str:
    """Return the child's user message: the task, and what the parent expects back."""
    parts = [delegation["task"]]
    if delegation["expectedOutput"]:
        parts.append(f"Expected output: {delegation['expectedOutput']}")
    if delegation["outputSchema"] is not None:
        schema = json.dumps(delegation["outputSchema"], indent=2)
        parts.append(
            "Answer with a single JSON document and nothing else; it must satisfy this JSON "
            f"schema:\n{schema}"
        )
    return "\n\n".join(parts)


def child_budget(
    parent: Run, settings: Settings, spent: RunTotals, share: float | None
) -> dict[str, Any] | str:
    """Return the child's budget options: a share of what the parent has left, or a refusal."""
    budget = run_budget(parent.options, settings)
    fraction = Decimal(str(share)) if share else Decimal(1)
    left: dict[str, Any] = {
        "maxCost": None if budget.max_cost is None else budget.max_cost - spent.known_cost,
        "maxTokens": None if budget.max_tokens is None else budget.max_tokens - spent.total_tokens,
        "maxModelCalls": None
        if budget.max_model_calls is None
        else budget.max_model_calls - spent.model_calls,
    }
    for name, value in left.items():
        if value is not None and value <= 0:
            return f"the run has no {name} budget left for a subagent"
    options: dict[str, Any] = {}
    if left["maxCost"] is not None:
        options["maxCost"] = money(left["maxCost"] * fraction)
    for name in ("maxTokens", "maxModelCalls"):
        if left[name] is not None:
            options[name] = max(1, int(Decimal(left[name]) * fraction))
    return options


async def _plan(
    conn: Conn,
    settings: Settings,
    parent: Run,
    parent_agent: AgentVersion,
    spent: RunTotals,
    delegation: Delegation,
) -> _Start:
    """Check one new delegation and describe the child run it starts."""
    ref = delegation["agent"] or f"{parent.agent_name}@{parent.agent_version}"

    def refuse(reason: str) -> _Start:
        return _Start(delegation, ref, None, reason)

    if parent.depth + 1 > settings.subagent_max_depth:
        return refuse(
            f"subagents may nest {settings.subagent_max_depth} deep "
            "(AGENTRT_SUBAGENT_MAX_DEPTH) and this run is a subagent at that depth; "
            "do the task yourself"
        )
    try:
        agent = (
            await resolve_agent(conn, parent.tenant_id, delegation["agent"])
            if delegation["agent"]
            else parent_agent
        )
    except UnknownAgentError as exc:
        return refuse(exc.message)
    ref = f"{agent.name}@{agent.version}"
    options: dict[str, Any] = {}
    tools = delegation["tools"]
    if tools is not None:
        mine = tool_allow_list(parent_agent, parent.options.get("tools"))
        foreign = sorted(set(tools) - set(mine)) if mine is not None else []
        if foreign:
            return refuse(f"a subagent may only get tools you have; not yours: {foreign}")
        options["tools"] = list(tools)
    budget = child_budget(parent, settings, spent, delegation["budgetShare"])
    if isinstance(budget, str):
        return refuse(budget)
    options.update(budget)
    if parent.deadline_at is not None:
        left_s = (parent.deadline_at - datetime.now(UTC)).total_seconds()
        if left_s < 1:
            return refuse("the run's deadline has passed; no time is left for a subagent")
        own = agent.spec.run_timeout_seconds
        options["timeoutSeconds"] = min(left_s, own) if own else left_s
    model = agent.spec.model if delegation["agent"] and agent.spec.model else parent.model
    child = NewChildRun(
        parent,
        child_task(delegation),
        model,
        options,
        (agent.name, agent.version),
        delegation["toolCallId"],
    )
    return _Start(delegation, ref, child, None)


def _replayed(row: dict[str, Any], head: RunHead) -> NewEvent | None:
    """The event a replayed step owes for a delegation recorded before (None: nothing)."""
    call_id = row["tool_call_id"]
    seen = next((c for c in head.snapshot.get("children", []) if c["toolCallId"] == call_id), None)
    if not ended(row):
        data = {
            "toolCallId": call_id,
            "childRunId": row["child_run_id"],
            "agent": row["agent"],
            "task": row["task"],
            "replayed": True,
        }
        return NewEvent(EventType.SUBAGENT_STARTED, data)
    if seen is not None and seen["status"] != "running":
        return None  # its end was reported already
    return NewEvent(EventType.SUBAGENT_COMPLETED, completed_event(row))


async def start_children(
    pool: Pool, settings: Settings, writer: EventWriter, run: Run, delegations: list[Delegation]
) -> None:
    """Record the delegations, start their children and store the parent's events, atomically."""
    async with pool.connection() as conn:
        recorded = await delegation_rows(conn, run.id)
        parent_agent = await run_agent(conn, run.tenant_id, *run.agent)
        spent, _ = await tree_usage(conn, run.id)
        running = sum(1 for r in recorded.values() if not ended(r))
        starts: list[_Start] = []
        replays: list[NewEvent] = []
        for delegation in delegations:
            row = recorded.get(delegation["toolCallId"])
            if row is not None:
                event = _replayed(row, writer.head)
                if event is not None:
                    replays.append(event)
                continue
            start = await _plan(conn, settings, run, parent_agent, spent, delegation)
            if start.child is not None:
                if running >= settings.subagent_max_children:
                    start = _Start(
                        delegation,
                        start.agent,
                        None,
                        f"at most {settings.subagent_max_children} subagents may run at once "
                        "for one run (AGENTRT_SUBAGENT_MAX_CHILDREN); delegate the rest once "
                        "these have answered",
                    )
                else:
                    running += 1
            starts.append(start)
    events = [*replays, *(_started(s) for s in starts if s.child is not None)]
    events += [_refused(s) for s in starts if s.child is None]
    events.sort(key=lambda e: e.type != EventType.SUBAGENT_STARTED)

    async def insert(conn: Conn, head: RunHead) -> None:
        for start in starts:
            if start.child is not None:
                await insert_child_run(conn, start.child)
            await _insert_call(conn, run, start)

    if events or starts:
        await writer.commit(events, insert)


def _started(start: _Start) -> NewEvent:
    assert start.child is not None
    return NewEvent(
        EventType.SUBAGENT_STARTED,
        {
            "toolCallId": start.delegation["toolCallId"],
            "childRunId": start.child.run_id,
            "agent": start.agent,
            "task": start.delegation["task"],
        },
    )


def _refused(start: _Start) -> NewEvent:
    return NewEvent(
        EventType.SUBAGENT_COMPLETED,
        {
            "toolCallId": start.delegation["toolCallId"],
            "childRunId": None,
            "agent": start.agent,
            "status": "refused",
            "summary": "",
            "error": start.refusal,
            "usage": RunTotals().to_json(),
        },
    )


async def _insert_call(conn: Conn, run: Run, start: _Start) -> None:
    delegation = start.delegation
    await conn.execute(
        "INSERT INTO subagent_calls (parent_run_id, tool_call_id, tenant_id, child_run_id,"
        " agent, task, spec, refusal, children) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            run.id,
            delegation["toolCallId"],
            run.tenant_id,
            start.child.run_id if start.child else None,
            start.agent,
            delegation["task"],
            Jsonb(dict(delegation)),
            start.refusal,
            1 if start.child else 0,
        ),
    )
