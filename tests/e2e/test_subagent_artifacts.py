"""A subagent's data belongs to its parent's: listed with its artifacts, erased with it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import serve, wait_for_status

pytestmark = pytest.mark.timeout(240)

SCRIPTS = {
    "lead": [
        ScriptedTurn(
            tool_calls=[
                ScriptedToolCall(
                    id="d1",
                    name="delegate",
                    args={"task": "Write the report.", "agent": "scribe"},
                ),
                ScriptedToolCall(
                    id="w0",
                    name="write_artifact",
                    args={"name": "plan.md", "content": "# Plan\n", "media_type": "text/markdown"},
                ),
            ]
        ),
        ScriptedTurn(text="The scribe wrote the report."),
    ],
    "scribe": [
        ScriptedTurn(
            tool_calls=[
                ScriptedToolCall(
                    id="w1",
                    name="write_artifact",
                    args={
                        "name": "report.md",
                        "content": "# Report\n",
                        "media_type": "text/markdown",
                    },
                )
            ]
        ),
        ScriptedTurn(text="Written."),
    ],
}
PROFILES = [
    {"name": "lead", "model": "scripted:lead", "tools": ["delegate", "write_artifact"]},
    {"name": "scribe", "model": "scripted:scribe", "tools": ["write_artifact"]},
]


@pytest.fixture(scope="module")
async def client(settings: Settings, pool: Pool) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, models=ModelRegistry(settings, SCRIPTS))
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        for profile in PROFILES:
            created = await c.post("/api/agents", json=profile)
            assert created.status_code == 201, created.text
        yield c


async def names(client: httpx.AsyncClient, run_id: str) -> list[Any]:
    listing = (await client.get(f"/api/runs/{run_id}/artifacts")).json()
    return sorted(a["name"] for a in listing["artifacts"])


async def test_a_parent_lists_what_its_subagent_wrote(client: httpx.AsyncClient) -> None:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    posted = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "go", "agent": "lead"}
    )
    assert posted.status_code == 202, posted.text
    parent = posted.json()["runId"]
    await wait_for_status(client, parent, "completed", limit_s=120)
    children = (await client.get(f"/api/runs/{parent}/children")).json()["children"]
    assert len(children) == 1
    assert await names(client, parent) == ["plan.md", "report.md"]
    assert await names(client, children[0]["runId"]) == ["report.md"]


async def test_erasing_the_parents_conversation_erases_its_subagents_too(
    client: httpx.AsyncClient, pool: Pool
) -> None:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    posted = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "go", "agent": "lead"}
    )
    parent = posted.json()["runId"]
    await wait_for_status(client, parent, "completed", limit_s=120)
    child = (await client.get(f"/api/runs/{parent}/children")).json()["children"][0]["runId"]
    child_conv = (await client.get(f"/api/runs/{child}")).json()["conversationId"]

    erased = await client.delete(f"/api/conversations/{conv}")

    assert erased.status_code == 200, erased.text
    async with pool.connection() as conn:
        for sql, arg in (
            ("SELECT count(*) AS n FROM runs WHERE id = ANY(%s)", [parent, child]),
            ("SELECT count(*) AS n FROM conversations WHERE id = ANY(%s)", [conv, child_conv]),
            ("SELECT count(*) AS n FROM messages WHERE conversation_id = ANY(%s)", [child_conv]),
            ("SELECT count(*) AS n FROM run_events WHERE run_id = ANY(%s)", [child]),
            ("SELECT count(*) AS n FROM checkpoints WHERE thread_id = ANY(%s)", [child_conv]),
            ("SELECT count(*) AS n FROM artifacts WHERE conversation_id = ANY(%s)", [child_conv]),
        ):
            cur = await conn.execute(sql, (arg,))
            row = await cur.fetchone()
            assert row is not None and row["n"] == 0, sql
