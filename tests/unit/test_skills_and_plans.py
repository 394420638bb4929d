"""Skills and plans in the agent graph (in-memory checkpointer, ledger and library).

A loaded skill pins its version, narrows the tools and puts its instructions in the system
prompt; the plan is state that `update_plan` changes and the `plan` section shows; a
profile that requires a plan refuses tool calls past the limit until one exists.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from graphs.agent import build_agent_graph
from graphs.context import RunContext
from nodes.context.plan import PLAN_SECTION
from nodes.context.sections import default_registry
from nodes.context.setup import ContextSetup
from nodes.context.skills import LOADED_SKILLS_SECTION, SKILLS_SECTION
from nodes.models.scripted import ScriptedChatModel, ScriptedToolCall, ScriptedTurn
from skills.format import REPOSITORY_SKILLS, parse_skill, scan
from skills.library import InMemorySkillLibrary
from skills.tools import load_skill, read_skill_resource
from tools.builtin import builtin_tools
from tools.ledger import InMemoryToolLedger
from tools.plan.tool import update_plan
from tools.policy import Toolbox
from tools.spec import ToolSpec, agent_tool

pytestmark = pytest.mark.timeout(60)

SKILL_V1 = """---
name: tidy
description: Tidy a list.
version: "1"
allowed-tools: current_time
---
Sort the list, then remove duplicates.
"""
SKILL_V2 = SKILL_V1.replace("Sort the list", "Reverse the list").replace('"1"', '"2"')
# Without `allowed-tools`: loading it narrows nothing.
OPEN_V1 = SKILL_V1.replace("allowed-tools: current_time\n", "")
OPEN_V2 = SKILL_V2.replace("allowed-tools: current_time\n", "")


def call(name: str, args: dict[str, Any] | None = None, call_id: str | None = None) -> Any:
    return ScriptedToolCall(name=name, args=args or {}, id=call_id)


class Harness:
    """One conversation on an in-memory graph with skills and plans switched on."""

    def __init__(
        self,
        turns: list[ScriptedTurn],
        library: InMemorySkillLibrary,
        plan: dict[str, Any] | None = None,
        preload: list[str] | None = None,
        extra: list[ToolSpec] | None = None,
        auto: dict[str, Any] | None = None,
    ) -> None:
        self.auto = auto or {}
        self.extra = extra or []
        self.graph = build_agent_graph().compile(checkpointer=InMemorySaver())
        self.model = ScriptedChatModel(turns=turns)
        self.library = library
        self.plan = plan or {"enabled": True}
        self.preload = preload or []
        self.ledger = InMemoryToolLedger()
        self.config: Any = {"configurable": {"thread_id": "t"}}
        self.events: list[dict[str, Any]] = []

    def context(self) -> RunContext:
        tools = [*builtin_tools([]), load_skill, read_skill_resource, update_plan, *self.extra]
        box = Toolbox.of(tools, run_id="run1", ledger=self.ledger)
        registry = (
            default_registry()
            .with_section(SKILLS_SECTION)
            .with_section(LOADED_SKILLS_SECTION)
            .with_section(PLAN_SECTION)
        )
        setup = ContextSetup(
            registry=registry,
            section_options={
                "skills": {
                    "library": self.library,
                    "preload": self.preload,
                    "autoSelect": self.auto,
                },
                "plan": self.plan,
            },
        )
        return RunContext(
            run_id="run1", model=self.model, tools=box.visible(), toolbox=box, context_setup=setup
        )

    async def run(self, graph_input: Any = None, message: str = "go") -> None:
        async for mode, chunk in self.graph.astream(
            graph_input
            if graph_input is not None
            else {"messages": [HumanMessage(message)], "run_id": "run1"},
            self.config,
            context=self.context(),
            stream_mode=["custom", "updates"],
        ):
            if mode == "custom":
                self.events.append(chunk)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    async def state(self) -> dict[str, Any]:
        return dict((await self.graph.aget_state(self.config)).values)

    async def tool_messages(self) -> dict[str, ToolMessage]:
        values = await self.state()
        return {m.tool_call_id: m for m in values["messages"] if isinstance(m, ToolMessage)}


async def test_a_loaded_skill_pins_its_version_narrows_tools_and_joins_the_prompt() -> None:
    library = InMemorySkillLibrary.of([parse_skill(SKILL_V1)])
    h = Harness(
        [
            ScriptedTurn(tool_calls=[call("load_skill", {"name": "tidy"}, "c1")]),
            ScriptedTurn(
                tool_calls=[
                    call("calculator", {"expression": "1+1"}, "c2"),
                    call("current_time", {}, "c3"),
                ]
            ),
            ScriptedTurn(text="done"),
        ],
        library,
    )
    await h.run()
    loaded = h.of("skill.loaded")
    assert [(e["name"], e["version"], e["label"]) for e in loaded] == [("tidy", 1, "1")]
    assert loaded[0]["hash"] == parse_skill(SKILL_V1).content_hash
    assert loaded[0]["allowedTools"] == ["current_time"]
    messages = await h.tool_messages()
    assert "instructions" not in json.loads(str(messages["c1"].content))
    assert messages["c2"].status == "error" and "forbidden" in str(messages["c2"].content)
    assert messages["c3"].status == "success"
    built = h.of("context.built")
    assert "calculator" in built[0]["tools"]
    assert "calculator" not in built[1]["tools"] and "current_time" in built[1]["tools"]
    assert {"load_skill", "update_plan"} <= set(built[1]["tools"])
    sections = {s["name"]: s for s in built[1]["sections"]}
    assert "loaded_skills" in sections and "loaded_skills" not in {
        s["name"] for s in built[0]["sections"] if s.get("items")
    }
    state = await h.state()
    assert state["skills"]["loaded"]["tidy"]["instructions"].startswith("Sort the list")


async def test_a_run_keeps_the_version_it_pinned_when_a_new_one_arrives() -> None:
    library = InMemorySkillLibrary.of([parse_skill(OPEN_V1)])

    @agent_tool
    async def publish_v2() -> str:
        """Publish version 2 of the skill (what an upload does meanwhile)."""
        library.add(parse_skill(OPEN_V2))
        return "published"

    h = Harness(
        [
            ScriptedTurn(tool_calls=[call("load_skill", {"name": "tidy"}, "c1")]),
            ScriptedTurn(tool_calls=[call("current_time", {}, "t")]),
            ScriptedTurn(tool_calls=[call("load_skill", {"name": "tidy"}, "c2")]),
            ScriptedTurn(text="done"),
        ],
        library,
        extra=[publish_v2],
    )
    h.model.turns[1] = ScriptedTurn(tool_calls=[call("publish_v2", {}, "p")])
    await h.run()
    assert (await library.get("tidy")).version == 2
    second = json.loads(str((await h.tool_messages())["c2"].content))
    assert second["hash"] == parse_skill(OPEN_V1).content_hash and second["version"] == 1
    state = await h.state()
    assert state["skills"]["loaded"]["tidy"]["instructions"].startswith("Sort the list")


async def test_unknown_disabled_and_broken_skills_are_clear_tool_errors() -> None:
    library = InMemorySkillLibrary.of(
        [parse_skill(SKILL_V1), parse_skill(SKILL_V1.replace("name: tidy", "name: off"))],
        broken={"bad": "the front matter of SKILL.md is not valid YAML"},
        disabled=frozenset({"off"}),
    )
    h = Harness(
        [
            ScriptedTurn(
                tool_calls=[
                    call("load_skill", {"name": "nope"}, "u"),
                    call("load_skill", {"name": "off"}, "d"),
                    call("load_skill", {"name": "bad"}, "b"),
                    call("read_skill_resource", {"skill": "tidy", "path": "x"}, "r"),
                ]
            ),
            ScriptedTurn(text="done"),
        ],
        library,
    )
    await h.run()
    messages = {k: str(m.content) for k, m in (await h.tool_messages()).items()}
    assert "there is no skill 'nope'" in messages["u"] and "tidy" in messages["u"]
    assert "disabled" in messages["d"]
    assert "fails to parse" in messages["b"] and "YAML" in messages["b"]
    assert "load the skill first" in messages["r"]
    assert h.of("skill.loaded") == []


async def test_the_plan_is_state_that_update_plan_changes_and_the_prompt_shows() -> None:
    steps = [{"title": "Find sources"}, {"title": "Write the brief"}]
    h = Harness(
        [
            ScriptedTurn(tool_calls=[call("update_plan", {"action": "create", "steps": steps})]),
            ScriptedTurn(
                tool_calls=[
                    call("update_plan", {"action": "mark", "step_id": "1", "status": "running"})
                ]
            ),
            ScriptedTurn(
                tool_calls=[
                    call("update_plan", {"action": "mark", "step_id": "1", "status": "done"}),
                    call("update_plan", {"action": "mark", "step_id": "9", "status": "done"}),
                ]
            ),
            ScriptedTurn(text="done"),
        ],
        InMemorySkillLibrary(),
    )
    await h.run()
    updates = h.of("plan.updated")
    assert [u["plan"]["revision"] for u in updates] == [1, 2, 3]
    assert updates[1]["changed"] == [
        {"id": "1", "change": "status", "from": "pending", "to": "running"}
    ]
    state = await h.state()
    assert [s["status"] for s in state["plan"]["steps"]] == ["done", "pending"]
    errors = [m for m in (await h.tool_messages()).values() if m.status == "error"]
    assert len(errors) == 1 and "step_id must be one of" in str(errors[0].content)
    last = h.of("context.built")[-1]
    assert "plan" in {s["name"] for s in last["sections"]}


async def test_a_required_plan_refuses_the_second_tool_call_until_one_exists() -> None:
    h = Harness(
        [
            ScriptedTurn(tool_calls=[call("current_time", {}, "t1")]),
            ScriptedTurn(tool_calls=[call("current_time", {}, "t2")]),
            ScriptedTurn(
                tool_calls=[
                    call("update_plan", {"action": "create", "steps": ["Check the time"]}, "p"),
                    call("current_time", {}, "t3"),
                ]
            ),
            ScriptedTurn(text="done"),
        ],
        InMemorySkillLibrary(),
        plan={"enabled": True, "required": True, "requiredBeforeToolCall": 2},
    )
    await h.run()
    messages = await h.tool_messages()
    assert messages["t1"].status == "success"
    assert messages["t2"].status == "error"
    assert "must make a plan before tool call number 2" in str(messages["t2"].content)
    assert messages["t3"].status == "success"


async def test_a_profile_preloads_skills_before_the_first_model_call() -> None:
    library = InMemorySkillLibrary.of([parse_skill(SKILL_V1)])
    h = Harness([ScriptedTurn(text="done")], library, preload=["tidy", "missing"])
    await h.run()
    loaded = h.of("skill.loaded")
    assert [(e["name"], e["via"]) for e in loaded] == [("tidy", "preload")]
    first = h.of("context.built")[0]
    assert "current_time" in first["tools"] and "calculator" not in first["tools"]


@pytest.mark.parametrize("name", ["research-brief", "data-cleaning-checklist", "meeting-notes"])
def test_each_shipped_skill_parses_and_names_only_files_it_ships(name: str) -> None:
    found, errors = scan(REPOSITORY_SKILLS)
    assert errors == {}
    skill = next(s for s in found if s.name == name)
    assert skill.label == "1.0.0" and skill.allowed_tools and skill.license
    assert 50 < len(skill.description) <= 1024
    mentioned = [p for p in skill.resources if p in skill.instructions]
    assert mentioned == sorted(skill.resources), "every resource is named in the instructions"
    for word in skill.instructions.split("`"):
        if "/" in word or word.endswith(".md"):
            assert word in skill.resources, f"{name} names {word}, which it does not ship"


async def test_shipped_research_brief_reads_its_grading_reference() -> None:
    found, _ = scan(REPOSITORY_SKILLS)
    h = Harness(
        [
            ScriptedTurn(tool_calls=[call("load_skill", {"name": "research-brief"}, "l")]),
            ScriptedTurn(
                tool_calls=[
                    call(
                        "read_skill_resource",
                        {"skill": "research-brief", "path": "reference/source-grading.md"},
                        "r",
                    )
                ]
            ),
            ScriptedTurn(text="done"),
        ],
        InMemorySkillLibrary.of(found),
    )
    await h.run()
    read = str((await h.tool_messages())["r"].content)
    assert read.startswith("# Grading sources")


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Here is the transcript of our call: write the minutes and action items", "meeting-notes"),
        ("Please clean this CSV: duplicates, missing values, odd dates", "data-cleaning-checklist"),
        ("What time is it?", None),
    ],
)
async def test_automatic_selection_loads_the_skill_that_matches_the_message(
    message: str, expected: str | None
) -> None:
    found, _ = scan(REPOSITORY_SKILLS)
    h = Harness(
        [ScriptedTurn(text="done")],
        InMemorySkillLibrary.of(found),
        auto={"enabled": True, "minSimilarity": 0.3},
    )
    await h.run(message=message)
    loaded = h.of("skill.loaded")
    if expected is None:
        assert loaded == []
    else:
        assert [(e["name"], e["via"]) for e in loaded] == [(expected, "auto")]
        assert loaded[0]["similarity"] >= 0.3
