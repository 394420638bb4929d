"""LangGraph API runs through the official SDK: wait, join, resume, double texting, cancel.

The graph is examples/tool_agent (langgraph.json); each test scripts the fake OpenAI server
under a model name of its own, chosen through the run's `context`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from langgraph_sdk.client import LangGraphClient

from server.settings import Settings
from tests.support import langgraph_server
from tests.support.fake_openai import FakeOpenAI, FakeToolCall, Reply
from tests.support.live import serve

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]
SLOW_S = 120
WEATHER = [
    Reply(text="", tool_calls=[FakeToolCall("check_weather", {"city": "Oslo"}, id="call_w1")]),
    Reply(text="Sunny in Oslo: walk to dinner.", chunk_chars=5),
]


@dataclass
class Frame:
    id: int | None
    event: str
    data: Any


@dataclass
class FrameReader:
    """LangGraph's SSE frames: `metadata` has no id; heartbeats are skipped."""

    buffer: str = ""

    def feed(self, text: str) -> list[Frame]:
        self.buffer += text
        out = []
        while "\n\n" in self.buffer:
            block, self.buffer = self.buffer.split("\n\n", 1)
            fields = dict(
                line.partition(": ")[::2] for line in block.split("\n") if line[:1] not in ":"
            )
            if "data" in fields:
                seq = int(fields["id"]) if "id" in fields else None
                out.append(Frame(seq, fields["event"], json.loads(fields["data"])))
        return out


def ask(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


# The shared server of these tests (tests/support/langgraph_server.py).
fake = langgraph_server.fake
model_env = langgraph_server.model_env
url = langgraph_server.url
client = langgraph_server.client


async def status_becomes(client: LangGraphClient, thread_id: str, run_id: str, want: str) -> None:
    async with asyncio.timeout(SLOW_S):
        while True:
            if (await client.runs.get(thread_id, run_id))["status"] == want:
                return
            await asyncio.sleep(0.05)


async def model_called(fake: FakeOpenAI, model: str, times: int) -> None:
    """Wait until the fake has received `times` requests for `model`.

    A run is `running` from its claim, before its graph has checkpointed the input; the
    model's request shows that the input is in the thread's state.
    """
    async with asyncio.timeout(SLOW_S):
        while True:
            if len(fake.served_for(model)) >= times:
                return
            await asyncio.sleep(0.05)


def texts(values: dict[str, Any]) -> list[str]:
    return [m["content"] for m in values["messages"]]


async def test_wait_answers_the_final_values(client: LangGraphClient, fake: FakeOpenAI) -> None:
    fake.script("m-wait", *WEATHER)
    thread = await client.threads.create()
    values = await client.runs.wait(
        thread["thread_id"], "tool_agent", input=ask("weather?"), context={"model": "m-wait"}
    )
    assert isinstance(values, dict)
    assert values["messages"][-1]["content"] == "Sunny in Oslo: walk to dinner."
    assert values["tool_rounds"] == 1, [s.body["messages"] for s in fake.served_for("m-wait")]
    assert (await client.threads.get(thread["thread_id"]))["status"] == "idle"


async def test_a_background_run_is_joined_and_its_stream_replayed(
    client: LangGraphClient, fake: FakeOpenAI
) -> None:
    fake.script("m-bg", *WEATHER)
    tid = (await client.threads.create())["thread_id"]
    run = await client.runs.create(
        tid, "tool_agent", input=ask("weather?"), context={"model": "m-bg"}, stream_mode="updates"
    )
    assert run["status"] in ("pending", "running")
    values = await client.runs.join(tid, run["run_id"])
    assert values["messages"][-1]["content"] == "Sunny in Oslo: walk to dinner."
    parts = [p async for p in client.runs.join_stream(tid, run["run_id"])]
    assert [p.event for p in parts] == ["metadata", "updates", "updates", "updates"]
    assert [next(iter(p.data)) for p in parts[1:]] == ["agent", "tools", "agent"]
    assert (await client.runs.get(tid, run["run_id"]))["status"] == "success"
    listed = await client.runs.list(tid)
    assert [r["run_id"] for r in listed] == [run["run_id"]]


async def test_a_late_join_answers_the_values_its_run_left_not_a_later_runs(
    client: LangGraphClient, fake: FakeOpenAI
) -> None:
    fake.script("m-late-join", Reply(text="first answer"), Reply(text="second answer"))
    tid = (await client.threads.create())["thread_id"]
    first = await client.runs.create(
        tid, "tool_agent", input=ask("one"), context={"model": "m-late-join"}
    )
    await client.runs.join(tid, first["run_id"])
    second = await client.runs.wait(
        tid, "tool_agent", input=ask("two"), context={"model": "m-late-join"}
    )
    assert texts(second) == ["one", "first answer", "two", "second answer"]
    # The thread has moved on; the first run's join (a webhook's body too) is what it left.
    assert texts(await client.runs.join(tid, first["run_id"])) == ["one", "first answer"]
    latest = [r["run_id"] for r in await client.runs.list(tid) if r["run_id"] != first["run_id"]]
    assert texts(await client.runs.join(tid, latest[0])) == texts(second)


async def test_streams_of_a_thread_whose_id_is_not_latin_1_name_it_percent_encoded(
    client: LangGraphClient, fake: FakeOpenAI, url: str
) -> None:
    # Found by fuzzing: a header carries Latin-1 only, and the Location of a thread's stream
    # held the raw id, so joining it failed with 500.
    fake.script("m-id", Reply(text="ok"))
    tid = "ù\U00099275Q-" + str(id(fake))
    assert (await client.threads.create(thread_id=tid))["thread_id"] == tid
    run = await client.runs.create(tid, "tool_agent", input=ask("hi"), context={"model": "m-id"})
    await client.runs.join(tid, run["run_id"])
    encoded = quote(tid, safe="")
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        joined = await http.get(f"/threads/{encoded}/runs/{run['run_id']}/stream")
        assert joined.status_code == 200, joined.text
        assert joined.headers["location"] == f"/threads/{encoded}/runs/{run['run_id']}/stream"
        assert "event: end" in joined.text or "event: metadata" in joined.text
        async with http.stream("GET", f"/threads/{encoded}/stream") as thread:
            assert thread.status_code == 200
            assert thread.headers["location"] == f"/threads/{encoded}/stream"


async def test_a_reconnect_with_last_event_id_loses_and_repeats_nothing(
    url: str, fake: FakeOpenAI
) -> None:
    fake.script(
        "m-resume", WEATHER[0], Reply(text="a slow answer in many small pieces", delay_s=1.0)
    )
    body = {
        "assistant_id": "tool_agent",
        "input": ask("weather?"),
        "context": {"model": "m-resume"},
        "stream_mode": ["values", "updates", "messages-tuple"],
    }
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        tid = (await http.post("/threads", json={})).json()["thread_id"]
        first: list[Any] = []
        reader = FrameReader()
        async with http.stream("POST", f"/threads/{tid}/runs/stream", json=body) as response:
            location = response.headers["location"]
            assert response.headers["content-location"] == location.removesuffix("/stream")
            async for text in response.aiter_text():
                first += reader.feed(text)
                if sum(1 for e in first if e.id is not None) >= 3:
                    break
        last = [e for e in first if e.id is not None][-1].id
        rest = await _read_all(http, location, {"Last-Event-ID": str(last)})
        whole = await _read_all(http, location, {})
    seen = [(e.id, e.event) for e in first if e.id is not None] + [(e.id, e.event) for e in rest]
    assert seen == [(e.id, e.event) for e in whole if e.id is not None]
    assert whole[0].event == "metadata" and rest[0].event != "metadata"
    assert len(rest) > 3


async def _read_all(http: httpx.AsyncClient, path: str, headers: dict[str, str]) -> list[Any]:
    reader, events = FrameReader(), []
    async with http.stream("GET", path, headers=headers) as response:
        async for text in response.aiter_text():
            events += reader.feed(text)
    return events


async def test_interrupt_then_command_resume(client: LangGraphClient, fake: FakeOpenAI) -> None:
    fake.script(
        "m-book",
        Reply(
            text="",
            tool_calls=[
                FakeToolCall("book_table", {"restaurant": "Maaemo", "people": 2}, id="call_b1")
            ],
        ),
        Reply(text="Your table is booked."),
    )
    tid = (await client.threads.create())["thread_id"]
    context = {"model": "m-book"}
    await client.runs.wait(tid, "tool_agent", input=ask("book Maaemo for 2"), context=context)
    thread = await client.threads.get(tid)
    assert thread["status"] == "interrupted"
    state = await client.threads.get_state(tid)
    assert state["interrupts"][0]["value"] == {"question": "Book Maaemo for 2?"}
    assert state["next"] == ["tools"]
    assert (await client.runs.list(tid))[0]["status"] == "interrupted"
    values = await client.runs.wait(tid, "tool_agent", command={"resume": "yes"}, context=context)
    assert texts(values)[-2:] == ["Booked Maaemo for 2.", "Your table is booked."]
    assert (await client.threads.get(tid))["status"] == "idle"


async def test_reject_answers_409_while_the_thread_is_busy(
    client: LangGraphClient, fake: FakeOpenAI
) -> None:
    fake.script("m-reject", Reply(text="slow", delay_s=2), Reply(text="second"))
    tid = (await client.threads.create())["thread_id"]
    context = {"model": "m-reject"}
    first = await client.runs.create(tid, "tool_agent", input=ask("one"), context=context)
    await status_becomes(client, tid, first["run_id"], "running")
    with pytest.raises(httpx.HTTPStatusError) as refused:
        await client.runs.create(
            tid, "tool_agent", input=ask("two"), context=context, multitask_strategy="reject"
        )
    assert refused.value.response.status_code == 409
    assert (await client.threads.get(tid))["status"] == "busy"
    await client.runs.join(tid, first["run_id"])
    assert (await client.runs.get(tid, first["run_id"]))["status"] == "success"


@pytest.mark.parametrize("strategy", ["interrupt", "rollback", "enqueue"])
async def test_double_texting_strategies(
    client: LangGraphClient, fake: FakeOpenAI, strategy: str
) -> None:
    model = f"m-{strategy}"
    fake.script(model, Reply(text="first answer", delay_s=3), Reply(text="second answer"))
    tid = (await client.threads.create())["thread_id"]
    context = {"model": model}
    first = await client.runs.create(tid, "tool_agent", input=ask("one"), context=context)
    await status_becomes(client, tid, first["run_id"], "running")
    await model_called(fake, model, 1)
    second = await client.runs.create(
        tid, "tool_agent", input=ask("two"), context=context, multitask_strategy=strategy
    )
    values = await client.runs.join(tid, second["run_id"])
    first_status = (await client.runs.get(tid, first["run_id"]))["status"]
    if strategy == "enqueue":
        assert first_status == "success"
        assert texts(values) == ["one", "first answer", "two", "second answer"]
    elif strategy == "interrupt":
        assert first_status == "interrupted"
        assert texts(values)[0] == "one" and texts(values)[-2:] == ["two", "second answer"]
    else:
        assert first_status == "interrupted"
        assert texts(values) == ["two", "second answer"]


@pytest.mark.parametrize("action", ["interrupt", "rollback"])
async def test_cancel_with_each_action(
    client: LangGraphClient, fake: FakeOpenAI, action: str
) -> None:
    model = f"m-cancel-{action}"
    fake.script(model, Reply(text="kept"), Reply(text="never", delay_s=30))
    tid = (await client.threads.create())["thread_id"]
    context = {"model": model}
    await client.runs.wait(tid, "tool_agent", input=ask("one"), context=context)
    run = await client.runs.create(tid, "tool_agent", input=ask("two"), context=context)
    await status_becomes(client, tid, run["run_id"], "running")
    await model_called(fake, model, 2)  # cancelled mid-call: the input "two" is kept
    await client.runs.cancel(tid, run["run_id"], wait=True, action=action)
    assert (await client.runs.get(tid, run["run_id"]))["status"] == "interrupted"
    values = (await client.threads.get_state(tid))["values"]
    if action == "rollback":
        assert texts(values) == ["one", "kept"]
    else:
        assert texts(values) == ["one", "kept", "two"]


async def test_state_update_history_and_fork_from_a_checkpoint(
    client: LangGraphClient, fake: FakeOpenAI
) -> None:
    fake.script("m-fork", *WEATHER, Reply(text="A forked answer."))
    tid = (await client.threads.create())["thread_id"]
    context = {"model": "m-fork"}
    await client.runs.wait(tid, "tool_agent", input=ask("weather?"), context=context)
    history = await client.threads.get_history(tid, limit=20)
    assert [h["next"] for h in history][:2] == [[], ["agent"]]
    start = next(h for h in reversed(history) if h["next"] == ["agent"])
    assert texts(start["values"]) == ["weather?"]
    forked = await client.runs.wait(
        tid,
        "tool_agent",
        input=None,
        checkpoint_id=start["checkpoint"]["checkpoint_id"],
        context=context,
    )
    assert texts(forked) == ["weather?", "A forked answer."]
    await client.threads.update_state(tid, {"tool_rounds": 7}, as_node="agent")
    state = await client.threads.get_state(tid)
    assert state["values"]["tool_rounds"] == 7
    old = await client.threads.get_state(tid, checkpoint_id=start["checkpoint"]["checkpoint_id"])
    assert texts(old["values"]) == ["weather?"]


async def test_a_webhook_is_retried_until_delivered(
    client: LangGraphClient, fake: FakeOpenAI, settings: Settings
) -> None:
    received: list[dict[str, Any]] = []
    arrived = asyncio.Event()
    receiver = FastAPI()
    receiver.state.settings = settings

    @receiver.post("/hook")
    async def hook(request: Request) -> Response:
        received.append(await request.json())
        arrived.set()
        return Response(status_code=503 if len(received) == 1 else 204)

    fake.script("m-hook", Reply(text="done"))
    async with serve(receiver) as hook_url:
        tid = (await client.threads.create())["thread_id"]
        run = await client.runs.create(
            tid,
            "tool_agent",
            input=ask("hello"),
            context={"model": "m-hook"},
            webhook=f"{hook_url}/hook",
        )
        async with asyncio.timeout(SLOW_S):
            while len(received) < 2:
                arrived.clear()
                await arrived.wait()
    assert [r["run_id"] for r in received] == [run["run_id"]] * 2
    assert received[-1]["status"] == "success"
    assert texts(received[-1]["values"]) == ["hello", "done"]


async def test_a_graphs_model_calls_reach_the_usage_ledger_and_the_native_api(
    client: LangGraphClient, fake: FakeOpenAI, url: str
) -> None:
    fake.script("gpt-4o-mini", *WEATHER)
    tid = (await client.threads.create())["thread_id"]
    run = await client.runs.create(tid, "tool_agent", input=ask("weather?"))
    await client.runs.join(tid, run["run_id"])
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        usage = (await http.get(f"/api/runs/{run['run_id']}/usage")).json()
        native = (await http.get(f"/api/runs/{run['run_id']}")).json()
    assert usage["totals"]["modelCalls"] == 2 and usage["totals"]["inputTokens"] > 0
    assert [c["modelId"] for c in usage["calls"]] == ["openai:gpt-4o-mini"] * 2
    assert usage["calls"][0]["cost"] is not None
    assert native["conversationId"] == tid and native["status"] == "completed"


async def test_agentrts_own_agent_and_native_runs_are_one_runtime(
    client: LangGraphClient, url: str
) -> None:
    tid = (await client.threads.create())["thread_id"]
    values = await client.runs.wait(
        tid, "agent", input={"messages": [{"role": "user", "content": "what is 6*7?"}]}
    )
    assert "42" in values["messages"][-1]["content"]
    lg_run = (await client.runs.list(tid))[0]
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        events = (await http.get(f"/api/runs/{lg_run['run_id']}/events")).text
        posted = await http.post(f"/api/conversations/{tid}/messages", json={"content": "and 2+2?"})
        native_id = posted.json()["runId"]
    assert "event: tool.completed" in events and "event: message.item.completed" in events
    await client.runs.join(tid, native_id)
    runs = await client.runs.list(tid)
    assert [r["run_id"] for r in runs] == [native_id, lg_run["run_id"]]
    assert {r["status"] for r in runs} == {"success"}
    state = await client.threads.get_state(tid)
    assert "4" in state["values"]["messages"][-1]["content"]


async def test_a_state_update_after_an_agent_turn_is_routed_outside_a_run(
    client: LangGraphClient,
) -> None:
    # With no `as_node`, LangGraph applies an update as the last node that ran (the model
    # call here) and routes after it with no run's runtime: the update lands, and a tool call
    # goes through the approval step, which asks only what the resuming run's policy requires.
    tid = (await client.threads.create())["thread_id"]
    await client.runs.wait(
        tid, "agent", input={"messages": [{"role": "user", "content": "what is 6*7?"}]}
    )
    noted = {"role": "assistant", "content": "Noted."}
    await client.threads.update_state(tid, {"messages": [noted]})
    state = await client.threads.get_state(tid)
    assert (state["values"]["messages"][-1]["content"], state["next"]) == ("Noted.", [])
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "name": "calculator", "args": {"expression": "2+2"}}],
    }
    await client.threads.update_state(tid, {"messages": [call]})
    assert (await client.threads.get_state(tid))["next"] == ["await_approval"]


async def test_supersteps_as_the_model_call_with_no_message_make_a_thread(
    client: LangGraphClient,
) -> None:
    thread = await client.threads.create(
        graph_id="agent", supersteps=[{"updates": [{"values": {}, "as_node": "call_model"}]}]
    )
    state = await client.threads.get_state(thread["thread_id"])
    assert (state["values"].get("messages", []), state["next"]) == ([], [])
