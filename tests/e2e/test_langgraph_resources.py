"""LangGraph API resources through the official SDK: assistants, threads and the store.

The graph is examples/tool_agent (langgraph.json); its model is the fake OpenAI server.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from tests.support import langgraph_server
from tests.support.fake_openai import FakeOpenAI, Reply

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]


def ask(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def texts(values: dict[str, Any]) -> list[str]:
    return [m["content"] for m in values["messages"]]


# The shared server of these tests (tests/support/langgraph_server.py).
fake = langgraph_server.fake
model_env = langgraph_server.model_env
url = langgraph_server.url
client = langgraph_server.client


async def test_store_put_get_and_semantic_search(client: LangGraphClient) -> None:
    namespace = ["default", "notes"]
    await client.store.put_item(namespace, "cat", {"text": "the cat sat on the mat"})
    await client.store.put_item(namespace, "stocks", {"text": "stock prices rose sharply"})
    item = await client.store.get_item(namespace, "cat")
    assert item["value"] == {"text": "the cat sat on the mat"}
    found = await client.store.search_items(namespace, query="a cat on a mat")
    assert found["items"][0]["key"] == "cat"
    listed = await client.store.list_namespaces(prefix=["default"])
    assert ["default", "notes"] in listed["namespaces"]
    await client.store.delete_item(namespace, "cat")
    with pytest.raises(httpx.HTTPStatusError) as missing:
        await client.store.get_item(namespace, "cat")
    assert missing.value.response.status_code == 404


async def test_thread_search_count_copy_and_if_exists(client: LangGraphClient) -> None:
    thread = await client.threads.create(metadata={"team": "blue"})
    again = await client.threads.create(thread_id=thread["thread_id"], if_exists="do_nothing")
    assert again["thread_id"] == thread["thread_id"]
    with pytest.raises(httpx.HTTPStatusError) as taken:
        await client.threads.create(thread_id=thread["thread_id"])
    assert taken.value.response.status_code == 409
    found = await client.threads.search(metadata={"team": "blue"})
    assert [t["thread_id"] for t in found] == [thread["thread_id"]]
    assert await client.threads.count(metadata={"team": "blue"}) == 1
    copied = await client.threads.copy(thread["thread_id"])
    assert copied["metadata"]["team"] == "blue"


async def test_assistants_are_created_versioned_and_used_by_runs(
    client: LangGraphClient, fake: FakeOpenAI, url: str
) -> None:
    made = await client.assistants.create(
        "tool_agent", context={"model": "m-v1"}, name="evening", metadata={"team": "night"}
    )
    assert made["version"] == 1 and made["graph_id"] == "tool_agent"
    changed = await client.assistants.update(made["assistant_id"], context={"model": "m-v2"})
    assert changed["version"] == 2 and changed["name"] == "evening"
    versions = await client.assistants.get_versions(made["assistant_id"])
    assert [v["version"] for v in versions] == [2, 1]
    fake.script("m-v2", Reply(text="from version two"))
    values = await client.runs.wait(None, made["assistant_id"], input=ask("hi"))
    assert texts(values) == ["hi", "from version two"]
    back = await client.assistants.set_latest(made["assistant_id"], 1)
    assert back["context"] == {"model": "m-v1"}
    found = await client.assistants.search(metadata={"team": "night"})
    assert [a["assistant_id"] for a in found] == [made["assistant_id"]]
    default = await client.assistants.get("tool_agent")
    with pytest.raises(httpx.HTTPStatusError) as fixed:
        await client.assistants.update(default["assistant_id"], name="renamed")
    assert fixed.value.response.status_code == 409
    await client.assistants.delete(made["assistant_id"])
    with pytest.raises(httpx.HTTPStatusError) as gone:
        await client.assistants.get(made["assistant_id"])
    assert gone.value.response.status_code == 404


async def test_an_assistant_of_the_own_agent_is_an_agent_profile(
    client: LangGraphClient, url: str
) -> None:
    profile = {"name": "planner", "instructions": "You plan evenings.", "model": "demo"}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        assert (await http.post("/api/agents", json=profile)).status_code == 201
        made = await client.assistants.create("agent", context={"agent": "planner"})
        run = await client.runs.create(
            None,
            made["assistant_id"],
            input={"messages": [{"role": "user", "content": "hi"}]},
            on_completion="keep",  # its events are read below
        )
        await client.runs.join(run["thread_id"], run["run_id"])
        created = (await http.get(f"/api/runs/{run['run_id']}/events")).text
    assert '"agent":"planner@1"' in created.replace(" ", "")


async def test_a_batch_of_runs_then_threads_pruned(
    client: LangGraphClient, fake: FakeOpenAI
) -> None:
    fake.script("m-batch", Reply(text="a"), Reply(text="b"))
    body = {"assistant_id": "tool_agent", "context": {"model": "m-batch"}, "on_completion": "keep"}
    runs = await client.runs.create_batch(
        [{**body, "input": ask("one")}, {**body, "input": ask("two")}]
    )
    assert len({r["thread_id"] for r in runs}) == 2
    for run in runs:
        await client.runs.join(run["thread_id"], run["run_id"])
    kept, gone = runs[0]["thread_id"], runs[1]["thread_id"]
    assert len(await client.threads.get_history(kept, limit=50)) > 1
    assert await client.threads.prune([kept], strategy="keep_latest") == {"pruned_count": 1}
    history = await client.threads.get_history(kept, limit=50)
    assert len(history) == 1 and len(history[0]["values"]["messages"]) == 2
    assert await client.threads.prune([gone]) == {"pruned_count": 1}
    with pytest.raises(httpx.HTTPStatusError) as missing:
        await client.threads.get(gone)
    assert missing.value.response.status_code == 404


async def test_a_negative_history_limit_is_refused_with_422(url: str) -> None:
    thread = await get_client(url=url).threads.create()
    async with httpx.AsyncClient(base_url=url, timeout=30) as raw:
        answer = await raw.get(f"/threads/{thread['thread_id']}/history", params={"limit": -1})
    assert answer.status_code == 422, answer.text
    assert "limit" in answer.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/store/namespaces", {"offset": 10**29}),
        ("/store/items/search", {"offset": 10**29}),
        ("/threads/search", {"offset": 10**29}),
        ("/assistants/search", {"offset": 10**29}),
    ],
)
async def test_an_offset_beyond_any_listing_is_refused_with_422(
    url: str, path: str, body: dict[str, int]
) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as raw:
        answer = await raw.post(path, json=body)
    assert answer.status_code == 422, answer.text
    assert "offset" in answer.text


@pytest.mark.parametrize(
    "filter_",
    [
        {"n": 2**70},
        {"n": {"$eq": -(2**64)}},
        {"tags": [1, [2, {"deep": 10**30}]]},
    ],
)
async def test_a_store_filter_with_an_integer_beyond_64_bits_is_refused_with_422(
    url: str, filter_: dict[str, Any]
) -> None:
    # Found by fuzzing: the store encodes filter values with orjson, which failed with 500.
    async with httpx.AsyncClient(base_url=url, timeout=30) as raw:
        answer = await raw.post("/store/items/search", json={"filter": filter_})
        assert answer.status_code == 422, answer.text
        assert "filter" in answer.text and "64" in answer.text
        fine = await raw.post("/store/items/search", json={"filter": {"n": 2**63 - 1}})
        assert fine.status_code == 200, fine.text


async def test_a_store_item_indexed_twice_by_one_field_is_stored_once(
    client: LangGraphClient,
) -> None:
    # Found by fuzzing: the same field twice in `index` answered 500 (the store's insert of
    # the item's vectors met its own row twice).
    namespace = ["default", "twice"]
    await client.store.put_item(
        namespace, "dog", {"text": "a dog in the park"}, index=["text", "text"]
    )
    found = await client.store.search_items(namespace, query="a dog in the park")
    assert [item["key"] for item in found["items"]] == ["dog"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", "/store/items", {"namespace": ["n"], "key": "k", "value": {}, "ttl": 1e-173}),
        ("PUT", "/store/items", {"namespace": ["n"], "key": "k", "value": {}, "ttl": 1e300}),
        ("POST", "/threads", {"ttl": 1e-173}),
        ("POST", "/threads", {"ttl": 1e300}),
        ("POST", "/threads", {"ttl": {"ttl": 1e300, "strategy": "delete"}}),
    ],
)
async def test_a_ttl_shorter_than_a_second_or_longer_than_a_year_is_refused_with_422(
    url: str, method: str, path: str, body: dict[str, Any]
) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as raw:
        answer = await raw.request(method, path, json=body)
    assert answer.status_code == 422, answer.text
    assert "ttl" in answer.text


async def test_what_a_body_names_and_is_missing_is_422_what_the_path_names_is_404(
    client: LangGraphClient,
) -> None:
    async def status(call: Any) -> tuple[int, dict[str, Any]]:
        with pytest.raises(httpx.HTTPStatusError) as failed:
            await call
        return failed.value.response.status_code, failed.value.response.json()["error"]

    tid = (await client.threads.create())["thread_id"]
    # POST /threads/{id}/state/checkpoint: the thread exists, the checkpoint does not.
    code, error = await status(client.threads.get_state(tid, checkpoint={"checkpoint_id": "x1"}))
    assert (code, error["code"]) == (422, "unknown_reference")
    assert f"thread {tid} has no checkpoint 'x1'" in error["message"]
    # GET /threads/{id}/state/{checkpoint_id}: the path names the checkpoint.
    code, error = await status(client.threads.get_state(tid, checkpoint_id="x1"))
    assert (code, error["code"]) == (404, "not_found")
    code, error = await status(client.runs.create(tid, "no_such_graph", input=ask("hi")))
    assert (code, error["code"]) == (422, "unknown_reference")
    assert "no_such_graph" in error["message"]
    code, error = await status(client.runs.create(str(uuid.uuid4()), "tool_agent"))
    assert (code, error["code"]) == (404, "not_found")
    code, error = await status(client.assistants.create("no_such_graph"))
    assert (code, error["code"]) == (422, "unknown_reference")
    made = await client.assistants.create("tool_agent")
    code, error = await status(client.assistants.set_latest(made["assistant_id"], 7))
    assert (code, error["code"]) == (422, "unknown_reference")
    assert "has no version 7" in error["message"]
    code, error = await status(client.assistants.set_latest(str(uuid.uuid4()), 1))
    assert code == 404
    # Nothing was stored by the refused requests.
    assert await client.runs.list(tid) == []
    assert (await client.assistants.get(made["assistant_id"]))["version"] == 1
