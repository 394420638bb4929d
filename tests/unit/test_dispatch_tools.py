"""The agent graph's tool steps with an in-memory ledger and checkpointer: replay, in-doubt
calls, retries, timeouts, the concurrency cap and approval interrupts."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from graphs.agent import build_agent_graph
from graphs.context import RunContext
from nodes.models.scripted import ScriptedChatModel, ScriptedToolCall, ScriptedTurn
from tools.config import TenantToolConfig, ToolConfig
from tools.errors import RetryableToolError
from tools.ledger import InMemoryToolLedger, LedgerEntry, idempotency_key
from tools.policy import Toolbox
from tools.spec import CallContext, RetryPolicy, ToolSpec, agent_tool


@dataclass
class Outside:
    """A fake outside system recording what the tools did to it."""

    effects: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    active: int = 0
    peak: int = 0
    flaky_failures: int = 2


def make_tools(outside: Outside) -> list[ToolSpec]:
    @agent_tool(idempotent=False)
    async def transfer(amount: int) -> str:
        """Move money (cannot be deduplicated).

        Args:
            amount: How much.
        """
        outside.effects.append(f"transfer {amount}")
        return f"moved {amount}"

    @agent_tool(idempotent=False, dedupes=True)
    async def charge(amount: int, call: CallContext) -> str:
        """Charge a card; the payment provider drops repeated idempotency keys.

        Args:
            amount: How much.
        """
        outside.keys.append(call.idempotency_key)
        if call.idempotency_key not in outside.effects:
            outside.effects.append(call.idempotency_key)
        return f"charged {amount}"

    @agent_tool(retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.001))
    async def flaky() -> str:
        """Fail twice, then work."""
        if outside.flaky_failures:
            outside.flaky_failures -= 1
            raise RetryableToolError("try again")
        return "finally"

    @agent_tool(idempotent=False, timeout_s=0.05)
    async def hang() -> str:
        """Never answer."""
        await asyncio.sleep(10)
        return "never"

    @agent_tool
    async def probe(n: int) -> str:
        """Measure concurrency.

        Args:
            n: A label.
        """
        outside.active += 1
        outside.peak = max(outside.peak, outside.active)
        await asyncio.sleep(0.02)
        outside.active -= 1
        return str(n)

    @agent_tool(risk="high")
    async def wipe(target: str) -> str:
        """Delete everything in a target.

        Args:
            target: What to delete.
        """
        outside.effects.append(f"wipe {target}")
        return f"wiped {target}"

    return [transfer, charge, flaky, hang, probe, wipe]


class Harness:
    def __init__(self, calls: list[ScriptedToolCall], **toolbox: Any) -> None:
        self.outside = Outside()
        self.ledger = InMemoryToolLedger()
        self.graph = build_agent_graph().compile(checkpointer=InMemorySaver())
        self.model = ScriptedChatModel(
            turns=[ScriptedTurn(tool_calls=calls), ScriptedTurn(text="done")]
        )
        self.tools = make_tools(self.outside)
        self.toolbox_kwargs = toolbox
        self.config: Any = {"configurable": {"thread_id": "t"}}
        self.events: list[dict[str, Any]] = []

    def context(self, generation: int) -> RunContext:
        box = Toolbox.of(
            self.tools,
            run_id="run1",
            generation=generation,
            ledger=self.ledger,
            **self.toolbox_kwargs,
        )
        return RunContext(run_id="run1", model=self.model, tools=box.visible(), toolbox=box)

    async def run(self, graph_input: Any, generation: int = 1) -> None:
        async for mode, chunk in self.graph.astream(
            graph_input,
            self.config,
            context=self.context(generation),
            stream_mode=["custom", "updates"],
        ):
            if mode == "custom":
                self.events.append(chunk)

    async def start(self) -> None:
        await self.run({"messages": [HumanMessage("go")], "run_id": "run1"})

    async def tool_messages(self) -> dict[str, ToolMessage]:
        state = await self.graph.aget_state(self.config)
        return {m.tool_call_id: m for m in state.values["messages"] if isinstance(m, ToolMessage)}

    def started(self, call_id: str, name: str, args: dict[str, Any], generation: int = 1) -> None:
        """Put an unfinished row in the ledger, as a crashed earlier attempt leaves it."""
        self.ledger.rows[("run1", call_id)] = LedgerEntry(
            "run1", call_id, name, args, idempotency_key("run1", call_id), "started", generation
        )


async def test_recorded_outcome_is_replayed_not_executed() -> None:
    h = Harness([ScriptedToolCall(name="transfer", args={"amount": 5}, id="c1")])
    h.ledger.rows[("run1", "c1")] = LedgerEntry(
        "run1", "c1", "transfer", {"amount": 5}, "k", "completed", 1, 1, output="moved 5"
    )
    await h.start()
    assert h.outside.effects == []
    assert (await h.tool_messages())["c1"].content == "moved 5"
    done = [e for e in h.events if e["event"] == "tool.completed"]
    assert done[0]["replayed"] is True


async def test_in_doubt_call_of_a_deduplicating_tool_reruns_with_the_same_key() -> None:
    h = Harness([ScriptedToolCall(name="charge", args={"amount": 9}, id="c1")])
    h.started("c1", "charge", {"amount": 9})
    h.outside.effects.append(idempotency_key("run1", "c1"))  # the crashed attempt's effect
    await h.run({"messages": [HumanMessage("go")], "run_id": "run1"}, generation=2)
    assert h.outside.keys == [idempotency_key("run1", "c1")]
    assert len(h.outside.effects) == 1
    assert h.ledger.rows[("run1", "c1")].status == "completed"
    assert h.ledger.rows[("run1", "c1")].attempts == 2


async def test_in_doubt_call_of_a_tool_that_cannot_dedupe_asks_a_human() -> None:
    h = Harness([ScriptedToolCall(name="transfer", args={"amount": 5}, id="c1")])
    h.started("c1", "transfer", {"amount": 5})
    await h.run({"messages": [HumanMessage("go")], "run_id": "run1"}, generation=2)
    state = await h.graph.aget_state(h.config)
    (intr,) = state.interrupts
    assert intr.value["kind"] == "in_doubt"
    assert intr.value["calls"][0]["toolCallId"] == "c1"
    assert h.outside.effects == []

    decision = {"decision": "reject", "reason": "it went through", "by": "ops"}
    await h.run(Command(resume={intr.id: {"decisions": {"c1": decision}}}), generation=3)
    message = (await h.tool_messages())["c1"]
    assert message.status == "error" and "it went through" in str(message.content)
    assert h.outside.effects == []
    assert h.ledger.rows[("run1", "c1")].status == "failed"


async def test_in_doubt_call_runs_again_when_a_human_approves() -> None:
    h = Harness([ScriptedToolCall(name="transfer", args={"amount": 5}, id="c1")])
    h.started("c1", "transfer", {"amount": 5})
    await h.run({"messages": [HumanMessage("go")], "run_id": "run1"}, generation=2)
    (intr,) = (await h.graph.aget_state(h.config)).interrupts
    await h.run(Command(resume={intr.id: {"decisions": {"c1": {"decision": "approve"}}}}), 3)
    assert h.outside.effects == ["transfer 5"]
    assert "a person had it run again" in str((await h.tool_messages())["c1"].content)


async def test_retryable_errors_are_retried_per_policy() -> None:
    h = Harness([ScriptedToolCall(name="flaky", id="c1")])
    await h.start()
    assert (await h.tool_messages())["c1"].content == "finally"
    assert [e["attempt"] for e in h.events if e["event"] == "tool.retrying"] == [1, 2]
    assert h.ledger.rows[("run1", "c1")].attempts == 3


async def test_a_timeout_of_a_tool_that_cannot_run_twice_is_not_retried() -> None:
    h = Harness([ScriptedToolCall(name="hang", id="c1")])
    await h.start()
    message = (await h.tool_messages())["c1"]
    assert message.status == "error"
    assert "did not finish within 0.05 s" in str(message.content)
    assert "the outcome is unknown" in str(message.content)
    assert not [e for e in h.events if e["event"] == "tool.retrying"]


async def test_parallel_calls_run_concurrently_up_to_the_cap() -> None:
    calls = [ScriptedToolCall(name="probe", args={"n": n}, id=f"c{n}") for n in range(6)]
    config = ToolConfig(default=TenantToolConfig(max_parallel_tools=2)).for_tenant("t")
    h = Harness(calls, config=config)
    await h.start()
    assert h.outside.peak == 2
    assert [m.content for m in (await h.tool_messages()).values()] == [str(n) for n in range(6)]


async def test_high_risk_call_waits_for_approval_and_reviewer_can_edit() -> None:
    h = Harness([ScriptedToolCall(name="wipe", args={"target": "prod"}, id="c1")])
    await h.start()
    state = await h.graph.aget_state(h.config)
    assert state.next == ("await_approval",)
    (intr,) = state.interrupts
    assert intr.value["kind"] == "approval" and intr.value["calls"][0]["risk"] == "high"
    assert h.outside.effects == []
    edit = {"decision": "edit", "args": {"target": "staging"}, "by": "rev"}
    await h.run(Command(resume={intr.id: {"decisions": {"c1": edit}}}))
    assert h.outside.effects == ["wipe staging"]
    content = str((await h.tool_messages())["c1"].content)
    assert "rev edited the arguments" in content and "wiped staging" in content
