"""Run the real app on a real socket inside the test's event loop, and read its SSE."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from server.settings import Settings


@asynccontextmanager
async def api_client(settings: Settings, **update: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the API served without workers, from `settings` with `update` applied.

    Runs are left to worker processes the test starts (tests/support/processes.py).
    """
    from server.app import create_app
    from server.usage.registry import ModelRegistry

    api = settings.model_copy(update={"run_workers": False, **update})
    async with (
        serve(create_app(api, models=ModelRegistry(api))) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        yield client


def free_port() -> int:
    """Return a TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


KEEP_ALIVE_S = Settings.model_fields["http_keep_alive_s"].default


async def post_in_new_conversation(
    client: httpx.AsyncClient, model: str, content: str = "hi"
) -> dict[str, Any]:
    """Create a conversation and post `content` to it with `model`; return the 202's body."""
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    response = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": content, "model": model}
    )
    assert response.status_code == 202, response.text
    run: dict[str, Any] = response.json()
    return run


@asynccontextmanager
async def serve(app: FastAPI) -> AsyncIterator[str]:
    """Serve `app` with uvicorn on a free loopback port; yield its base URL."""
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        # As `agentrt serve` does: a short keep-alive races the client's next request.
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(60):
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


@dataclass
class SseEvent:
    """One parsed SSE frame."""

    id: int
    event: str
    data: dict[str, Any]


@dataclass
class SseReader:
    """Parse an SSE byte stream into events (comments and heartbeats skipped)."""

    buffer: str = ""
    events: list[SseEvent] = field(default_factory=list)

    def feed(self, text: str) -> list[SseEvent]:
        self.buffer += text
        out = []
        while "\n\n" in self.buffer:
            block, self.buffer = self.buffer.split("\n\n", 1)
            fields: dict[str, str] = {}
            for line in block.split("\n"):
                if not line or line.startswith(":"):
                    continue
                key, _, value = line.partition(": ")
                fields[key] = value
            if "data" in fields:
                event = SseEvent(int(fields["id"]), fields["event"], json.loads(fields["data"]))
                out.append(event)
        self.events.extend(out)
        return out


async def read_sse(
    client: httpx.AsyncClient,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    stop_after: int | None = None,
    method: str = "GET",
    body: Any = None,
) -> list[SseEvent]:
    """Read the SSE stream at `path` to its end, or until `stop_after` events, then close.

    `method` and `body` (sent as JSON) serve requests that answer with a stream, like a
    message posted with `stream=true`.
    """
    reader = SseReader()
    async with client.stream(method, path, headers=headers, json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for text in response.aiter_text():
            reader.feed(text)
            if stop_after is not None and len(reader.events) >= stop_after:
                return reader.events[:stop_after]
    return reader.events


def rebuild_output(events: list[SseEvent]) -> str:
    """Rebuild the assistant output from deltas, dropping superseded items (docs/events.md)."""
    texts: dict[str, str] = {}
    superseded: set[str] = set()
    for e in events:
        if e.event == "message.item.created":
            texts[e.data["data"]["itemId"]] = ""
        elif e.event == "message.item.delta":
            texts[e.data["data"]["itemId"]] += e.data["data"]["delta"]
        elif e.event == "message.item.completed" and e.data["data"]["status"] == "superseded":
            superseded.add(e.data["data"]["itemId"])
    return "\n\n".join(t for i, t in texts.items() if i not in superseded and t)


async def wait_for_event(
    client: httpx.AsyncClient,
    path: str,
    kind: str,
    *,
    headers: dict[str, str] | None = None,
    limit_s: float = 30,
) -> list[SseEvent]:
    """Read the SSE stream at `path` until an event of type `kind` arrives; return all so far."""
    reader = SseReader()
    async with asyncio.timeout(limit_s), client.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        async for text in response.aiter_text():
            for event in reader.feed(text):
                if event.event == kind:
                    return reader.events
    raise AssertionError(f"the stream ended without {kind}: {[e.event for e in reader.events]}")


async def wait_for_status(
    client: httpx.AsyncClient,
    run_id: str,
    status: str,
    *,
    headers: dict[str, str] | None = None,
    limit_s: float = 30,
) -> dict[str, Any]:
    """Poll the run record until it has `status`; return it."""
    async with asyncio.timeout(limit_s):
        while True:
            run: dict[str, Any] = (await client.get(f"/api/runs/{run_id}", headers=headers)).json()
            if run["status"] == status:
                return run
            await asyncio.sleep(0.05)


def assert_items_carry_their_text(events: list[SseEvent]) -> None:
    """Check every `message.item.completed` carries `text` equal to its deltas (any status)."""
    streamed: dict[str, str] = {}
    for e in events:
        data = e.data["data"]
        if e.event == "message.item.delta":
            streamed[data["itemId"]] = streamed.get(data["itemId"], "") + data["delta"]
        elif e.event == "message.item.completed" and data["itemId"] in streamed:
            assert data.get("text") == streamed[data["itemId"]], (e.id, data)
