"""The LangGraph Agent Server API, driven by the official `langgraph_sdk` client.

The graph is examples/tool_agent (langgraph.json), its model the fake OpenAI server. What
the server streams for a mode is compared with what `graph.astream` yields in-process for
the same mode and the same scripted model, apart from ids and timestamps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph_sdk.client import LangGraphClient

from server.langgraph_api.serde import to_json
from tests.support import langgraph_server
from tests.support.fake_openai import FakeOpenAI, FakeToolCall, Reply

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]
MODEL = "gpt-4o-mini"
WEATHER = [
    Reply(text="", tool_calls=[FakeToolCall("check_weather", {"city": "Oslo"}, id="call_w1")]),
    Reply(text="Sunny in Oslo: walk to dinner.", chunk_chars=5),
]
BOOKING = [
    Reply(
        text="",
        tool_calls=[
            FakeToolCall("book_table", {"restaurant": "Maaemo", "people": 2}, id="call_b1")
        ],
    ),
    Reply(text="Your table is booked."),
]
# Values that differ between two executions of the same graph with the same model replies.
VOLATILE = {"id", "run_id", "thread_id", "checkpoint_id", "ts", "timestamp", "created_at"}
VOLATILE |= {"parent_checkpoint", "parent_config", "checkpoint", "config", "task_id"}
VOLATILE |= {"langgraph_checkpoint_ns", "checkpoint_ns", "langgraph_path", "parents", "step"}
VOLATILE |= {"created", "system_fingerprint", "model_provider", "graph_id", "assistant_id"}
VOLATILE |= {"parent_ids"}


# The shared server of these tests (tests/support/langgraph_server.py).
fake = langgraph_server.fake
model_env = langgraph_server.model_env
url = langgraph_server.url
client = langgraph_server.client


def normalise(value: Any) -> Any:
    """Drop what differs between two executions: ids, timestamps, checkpoint addresses."""
    if isinstance(value, dict):
        kept = {k: normalise(v) for k, v in value.items() if k not in VOLATILE}
        # The server's run metadata (run and graph ids) reaches the tasks' metadata.
        return {k: v for k, v in kept.items() if not (k == "metadata" and v == {})}
    if isinstance(value, (list, tuple)):
        return [normalise(v) for v in value]
    if isinstance(value, str) and value.startswith(("chatcmpl-", "run-", "lc_run--")):
        return "<id>"
    return value


async def in_process(
    fake: FakeOpenAI, replies: list[Reply], graph_input: Any, modes: list[str]
) -> list[tuple[str, Any]]:
    """Stream the example graph in this process, as (event name, JSON data) pairs."""
    from examples.tool_agent.graph import builder

    fake.script(MODEL, *replies)
    graph = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "local"}}
    parts = []
    async for mode, chunk in graph.astream(graph_input, config, stream_mode=modes):
        parts.append((mode, to_json(chunk)))
    return parts


def names(modes: list[str]) -> list[str]:
    return ["messages-tuple" if m == "messages" else m for m in modes]


async def test_assistants_search_lists_one_assistant_per_graph(client: LangGraphClient) -> None:
    found = await client.assistants.search()
    assert {a["graph_id"] for a in found} == {"agent", "tool_agent"}
    one = await client.assistants.get("tool_agent")
    assert one["assistant_id"] == next(
        a["assistant_id"] for a in found if a["graph_id"] == "tool_agent"
    )
    assert await client.assistants.count(graph_id="tool_agent") == 1


@pytest.mark.parametrize(
    "modes",
    [["values"], ["updates"], ["messages"], ["custom"], ["tasks"], ["checkpoints"], ["debug"]],
    ids=lambda m: m[0],
)
async def test_each_stream_mode_matches_in_process_execution(
    client: LangGraphClient, fake: FakeOpenAI, modes: list[str]
) -> None:
    graph_input = {"messages": [{"role": "user", "content": "weather in Oslo?"}]}
    expected = await in_process(fake, WEATHER, graph_input, modes)
    fake.script(MODEL, *WEATHER)
    thread = await client.threads.create()
    parts = [
        (p.event, p.data)
        async for p in client.runs.stream(
            thread["thread_id"], "tool_agent", input=graph_input, stream_mode=names(modes)
        )
    ]
    assert parts[0][0] == "metadata"
    assert normalise(parts[1:]) == normalise(expected)
    assert expected


async def test_messages_mode_sends_each_messages_metadata_then_the_message_so_far(
    client: LangGraphClient, fake: FakeOpenAI
) -> None:
    fake.script(MODEL, *WEATHER)
    thread = await client.threads.create()
    parts = [
        (p.event, p.data)
        async for p in client.runs.stream(
            thread["thread_id"],
            "tool_agent",
            input={"messages": [{"role": "user", "content": "weather in Oslo?"}]},
            stream_mode=["messages", "values"],
        )
    ]
    final = [d for e, d in parts if e == "values"][-1]["messages"]
    partials = [d[0] for e, d in parts if e == "messages/partial"]
    announced = [next(iter(d)) for e, d in parts if e == "messages/metadata"]
    answer = final[-1]
    assert [p["content"] for p in partials if p["id"] == answer["id"]][-1] == answer["content"]
    complete = [d[0] for e, d in parts if e == "messages/complete"]
    assert [c["type"] for c in complete] == ["tool"]
    assert {p["id"] for p in partials + complete} == set(announced)
    assert len(announced) == 3
    first_partial = {}
    for n, (event, data) in enumerate(parts):
        if event in ("messages/partial", "messages/complete"):
            first_partial.setdefault(data[0]["id"], n)
    for n, (event, data) in enumerate(parts):
        if event == "messages/metadata":
            assert n < first_partial[next(iter(data))]


async def test_events_mode_matches_astream_events_in_process(
    client: LangGraphClient, fake: FakeOpenAI
) -> None:
    from examples.tool_agent.graph import builder

    graph_input = {"messages": [{"role": "user", "content": "weather in Oslo?"}]}
    fake.script(MODEL, *WEATHER)
    graph = builder.compile(checkpointer=InMemorySaver())
    expected: list[Any] = []
    root = None
    async for event in graph.astream_events(
        graph_input, {"configurable": {"thread_id": "local"}}, version="v2"
    ):
        root = root or event["run_id"]
        if not (event["event"] == "on_chain_stream" and event["run_id"] == root):
            expected.append(to_json(event))
    fake.script(MODEL, *WEATHER)
    thread = await client.threads.create()
    parts = [
        (p.event, p.data)
        async for p in client.runs.stream(
            thread["thread_id"], "tool_agent", input=graph_input, stream_mode=["events", "values"]
        )
    ]
    assert parts[0][0] == "metadata"
    events = [d for e, d in parts if e == "events"]
    assert normalise(events) == normalise(expected)
    kinds = {e["event"] for e in events}
    assert {"on_chain_start", "on_chat_model_stream", "on_tool_end", "on_chain_end"} <= kinds
    # The other modes asked for come along, as `astream` gives them.
    assert [e for e, _ in parts[1:] if e != "events"] == ["values"] * 4
