"""A conversation's export is streamed JSON lines whose events equal the run's log."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.db.pool import Pool
from server.events.log import read_events
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import read_sse, serve

pytestmark = pytest.mark.timeout(240)
LONG = " ".join(f"word{i}" for i in range(6000))
# A long log: each tool call is two events (a streamed answer's pieces are joined into few).
CALLS = 600
SCRIPTS = {
    "long": [
        ScriptedTurn(
            tool_calls=[
                ScriptedToolCall(name="calculator", args={"expression": f"{n}+1"})
                for n in range(CALLS)
            ]
        ),
        ScriptedTurn(
            text=LONG,
            chunk_chars=3,
            usage={"input_tokens": 10, "output_tokens": 9000, "total_tokens": 9010},
        ),
    ]
}


@pytest.fixture(scope="module")
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, models=ModelRegistry(settings, SCRIPTS))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as c:
        yield c


async def test_the_export_of_a_long_run_equals_its_log_and_is_streamed(
    client: httpx.AsyncClient, pool: Pool
) -> None:
    conv = (await client.post("/api/conversations", json={"title": "long"})).json()
    conv_id = conv["conversationId"]
    runs = []
    for _ in range(2):
        accepted = (
            await client.post(
                f"/api/conversations/{conv_id}/messages",
                json={"content": "talk", "model": "scripted:long"},
            )
        ).json()
        assert (await read_sse(client, accepted["streamUrl"]))[-1].event == "run.completed"
        runs.append(accepted["runId"])
    log: list[dict[str, object]] = []
    async with pool.connection() as conn:
        for run_id in runs:
            log += [json.loads(wire) for _, _, wire in await read_events(conn, run_id, 0, 10**6)]
    assert len(log) > 2000

    chunks = 0
    lines: list[dict[str, object]] = []
    async with client.stream("GET", f"/api/conversations/{conv_id}/export") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/x-ndjson")
        assert "content-length" not in response.headers  # streamed, not built in memory
        buffer = b""
        async for chunk in response.aiter_raw():
            chunks += 1
            buffer += chunk
        lines = [json.loads(line) for line in buffer.decode().splitlines()]

    assert chunks > 2
    kinds = [line["kind"] for line in lines]
    assert kinds[0] == "conversation" and lines[0]["title"] == "long"
    assert [line["event"] for line in lines if line["kind"] == "event"] == log
    assert [line["runId"] for line in lines if line["kind"] == "run"] == runs
    messages = [line for line in lines if line["kind"] == "message"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[1]["content"] == LONG
    usage = [line for line in lines if line["kind"] == "usage"]
    # Two model calls a run: the tool calls', then the answer's.
    assert [u["outputTokens"] == 9000 for u in usage] == [False, True, False, True]


async def test_exporting_an_unknown_conversation_answers_404(client: httpx.AsyncClient) -> None:
    response = await client.get("/api/conversations/conv_missing/export")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
