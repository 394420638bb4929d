"""Dropping the stream never loses or repeats an event, and never affects the run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import SseEvent, SseReader, read_sse, rebuild_output, serve

SLOW = [
    ScriptedTurn(
        text="Checking the clock first. ",
        chunk_chars=3,
        delay_s=0.005,
        tool_calls=[ScriptedToolCall(name="current_time", args={})],
    ),
    ScriptedTurn(
        text="one two three four five six seven eight nine ten " * 6, chunk_chars=4, delay_s=0.01
    ),
]


@pytest.fixture(scope="module")
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, models=ModelRegistry(settings, {"slow": SLOW}))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        yield c


async def start(client: httpx.AsyncClient) -> str:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    response = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "go", "model": "scripted:slow"}
    )
    return str(response.json()["runId"])


def check_complete(events: list[SseEvent]) -> None:
    assert [e.id for e in events] == list(range(1, len(events) + 1)), "gap or duplicate"
    assert events[-1].event == "run.completed"


async def test_reconnect_with_last_event_id_misses_and_repeats_nothing(
    client: httpx.AsyncClient,
) -> None:
    run_id = await start(client)
    path = f"/api/runs/{run_id}/events"
    first = await read_sse(client, path, stop_after=12)  # then the client drops the connection
    run = (await client.get(f"/api/runs/{run_id}")).json()
    assert run["status"] not in ("completed", "failed", "cancelled"), "run should still be going"

    rest = await read_sse(client, path, headers={"Last-Event-ID": str(first[-1].id)})
    combined = first + rest
    check_complete(combined)
    assert rest[0].id == first[-1].id + 1

    full = await read_sse(client, path)
    assert [e.data for e in combined] == [e.data for e in full]


async def test_several_disconnects_in_a_row_still_give_the_whole_log(
    client: httpx.AsyncClient,
) -> None:
    run_id = await start(client)
    path = f"/api/runs/{run_id}/events"
    seen: list[SseEvent] = []
    while not seen or seen[-1].event != "run.completed":
        after = seen[-1].id if seen else 0
        seen += await read_sse(client, f"{path}?after={after}", stop_after=7)
    check_complete(seen)
    snapshot = (await client.get(f"/api/runs/{run_id}/snapshot")).json()
    assert rebuild_output(seen) == snapshot["output"]


async def test_refreshed_page_matches_a_client_that_watched_from_the_start(
    client: httpx.AsyncClient,
) -> None:
    run_id = await start(client)
    path = f"/api/runs/{run_id}/events"
    watcher = asyncio.create_task(read_sse(client, path))
    # Wait until the answer is streaming, then "refresh": snapshot, then the log after it.
    async with asyncio.timeout(20):
        while True:
            snapshot = (await client.get(f"/api/runs/{run_id}/snapshot")).json()
            if len(snapshot["items"]) == 2 and snapshot["items"][1]["text"]:
                break
            await asyncio.sleep(0.01)
    assert snapshot["status"] == "running"
    after = await read_sse(client, path, headers={"Last-Event-ID": str(snapshot["lastEventId"])})
    watched = await watcher

    texts = {i["itemId"]: i["text"] for i in snapshot["items"]}
    for event in after:
        data = event.data["data"]
        if event.event == "message.item.created":
            texts[data["itemId"]] = ""
        elif event.event == "message.item.delta":
            texts[data["itemId"]] += data["delta"]
    refreshed = "\n\n".join(t for t in texts.values() if t)
    assert refreshed == rebuild_output(watched)
    assert after[-1].id == watched[-1].id
    final = (await client.get(f"/api/runs/{run_id}/snapshot")).json()
    assert final["output"] == refreshed


async def test_a_finished_run_replays_and_closes(client: httpx.AsyncClient) -> None:
    run_id = await start(client)
    events = await read_sse(client, f"/api/runs/{run_id}/events")
    check_complete(events)
    tail = await read_sse(client, f"/api/runs/{run_id}/events?after={events[-1].id}")
    assert tail == []
    last_two = await read_sse(client, f"/api/runs/{run_id}/events?after={events[-1].id - 2}")
    assert [e.id for e in last_two] == [events[-2].id, events[-1].id]


async def test_bad_last_event_id_is_a_clear_400(client: httpx.AsyncClient) -> None:
    run_id = await start(client)
    response = await client.get(
        f"/api/runs/{run_id}/events", headers={"Last-Event-ID": "yesterday"}
    )
    assert response.status_code == 400
    assert "Last-Event-ID" in response.json()["error"]["message"]


async def post_streamed(
    client: httpx.AsyncClient,
    path: str,
    body: dict[str, str],
    headers: dict[str, str] | None = None,
) -> tuple[httpx.Headers, list[SseEvent]]:
    """POST `body` to `path` (a streamed post) and read the answer's SSE to its end."""
    reader = SseReader()
    async with client.stream("POST", path, json=body, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        async for text in response.aiter_text():
            reader.feed(text)
    return response.headers, reader.events


async def test_a_message_posted_with_stream_true_answers_with_the_whole_run_as_sse(
    client: httpx.AsyncClient,
) -> None:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    path = f"/api/conversations/{conv}/messages?stream=true"
    body = {"content": "go", "model": "scripted:slow"}
    answer, streamed = await post_streamed(client, path, body)
    assert answer["content-type"].startswith("text/event-stream")
    run_id = answer["x-run-id"]
    check_complete(streamed)
    assert streamed[0].event == "run.created"
    assert {e.data["runId"] for e in streamed} == {run_id}
    # The same log as the run's own stream, and the run is the conversation's.
    replayed = await read_sse(client, f"/api/runs/{run_id}/events")
    assert [e.data for e in streamed] == [e.data for e in replayed]
    runs = (await client.get(f"/api/conversations/{conv}/runs")).json()["runs"]
    assert [r["runId"] for r in runs] == [run_id]


async def test_a_streamed_post_dropped_midway_resumes_on_the_runs_stream_exactly(
    client: httpx.AsyncClient,
) -> None:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    first = await read_sse(
        client,
        f"/api/conversations/{conv}/messages?stream=true",
        method="POST",
        body={"content": "go", "model": "scripted:slow"},
        stop_after=9,
    )
    run_id = first[0].data["runId"]
    rest = await read_sse(
        client, f"/api/runs/{run_id}/events", headers={"Last-Event-ID": str(first[-1].id)}
    )
    check_complete(first + rest)


async def test_a_streamed_post_replayed_by_its_idempotency_key_streams_the_first_run(
    client: httpx.AsyncClient,
) -> None:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    path = f"/api/conversations/{conv}/messages?stream=true"
    body = {"content": "go", "model": "scripted:slow"}
    headers = {"Idempotency-Key": f"key-{conv}"}
    first = await read_sse(client, path, method="POST", body=body, headers=headers)
    again, replayed = await post_streamed(client, path, body, headers)
    assert again["idempotent-replayed"] == "true"
    assert again["x-run-id"] == first[0].data["runId"]
    assert [e.data for e in replayed] == [e.data for e in first]
    runs = (await client.get(f"/api/conversations/{conv}/runs")).json()["runs"]
    assert len(runs) == 1


async def test_a_refused_streamed_post_answers_json_errors_not_a_stream(
    client: httpx.AsyncClient,
) -> None:
    missing = await client.post(
        "/api/conversations/conv_missing/messages?stream=true", json={"content": "go"}
    )
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    blank = await client.post(
        f"/api/conversations/{conv}/messages?stream=true", json={"content": " "}
    )
    assert blank.status_code == 422
    assert "content" in blank.json()["error"]["message"]
