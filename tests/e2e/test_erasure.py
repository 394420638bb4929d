"""Erasure removes every row of a conversation or a user, table by table, and nothing else."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.auth import Principal, create_api_key
from server.db.pool import Pool
from server.lifecycle.erasure import erase_user
from server.observability.tracing import hex_trace_id
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import read_sse, serve, wait_for_event, wait_for_status
from tools.config import ToolConfig
from tools.spec import agent_tool

pytestmark = pytest.mark.timeout(240)
USAGE = {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}
# Tables whose rows are not a user's data: the erasure's own bookkeeping, and the audit log
# (actor and target ids, never content), which outlives an erasure by design.
NOT_ERASED = {"erasures", "audit_log", "api_keys", "schema_migrations"}


@agent_tool
async def page(message: str) -> str:
    """Page the on-call engineer.

    Args:
        message: What to tell them.
    """
    return "paged"


SCRIPTS = {
    "hi": [ScriptedTurn(text="hello there", usage=USAGE)],
    "page": [
        ScriptedTurn(tool_calls=[ScriptedToolCall(id="p1", name="page", args={"message": "x"})]),
        ScriptedTurn(text="Paged."),
    ],
}


@dataclass
class Env:
    app: FastAPI
    client: httpx.AsyncClient
    keys: dict[str, dict[str, str]]


@pytest.fixture(scope="module")
async def env(settings: Settings, pool: Pool) -> AsyncIterator[Env]:
    config = ToolConfig.model_validate(
        {"tenants": {"acme": {"tools": {"page": {"approval": "always"}}}}}
    )
    custom = settings.model_copy(update={"auth_enabled": True, "tool_config": config})
    app = create_app(custom, models=ModelRegistry(custom, SCRIPTS), tools=[page])
    keys = {}
    for user, roles in (("alice", []), ("bob", []), ("ann", ["admin"]), ("carl", []), ("dora", [])):
        key = await create_api_key(pool, "acme", user, roles)
        keys[user] = {"Authorization": f"Bearer {key}"}
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        yield Env(app, client, keys)


async def converse(env: Env, user: str, turns: int = 2) -> tuple[str, list[str]]:
    """A conversation of `user` with `turns` completed runs and a memory learnt in it."""
    c, headers = env.client, env.keys[user]
    conv = (await c.post("/api/conversations", json={}, headers=headers)).json()["conversationId"]
    runs = []
    for _ in range(turns):
        accepted = (
            await c.post(
                f"/api/conversations/{conv}/messages",
                json={"content": "hi", "model": "scripted:hi"},
                headers=headers,
            )
        ).json()
        assert (await read_sse(c, accepted["streamUrl"], headers=headers))[-1].event == (
            "run.completed"
        )
        runs.append(accepted["runId"])
    store = env.app.state.runtime.store
    namespace = ("acme", "users", user, "memories")
    await store.aput(namespace, f"m-{conv}", {"text": f"{user} likes tea", "sourceRunId": runs[0]})
    await store.aput(namespace, f"manual-{user}", {"text": f"{user} is on call"})
    return conv, runs


async def leftovers(
    pool: Pool, user: str, conversations: list[str], runs: list[str]
) -> dict[str, int]:
    """Rows referencing the user, their conversations or runs, in every table that could hold
    them (found from the schema, so a new table is checked without being listed here)."""
    found: dict[str, int] = {}
    traces = [hex_trace_id(r) for r in runs]
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT c.table_name, array_agg(c.column_name::text) AS columns"
            " FROM information_schema.columns c JOIN information_schema.tables t"
            " USING (table_schema, table_name)"
            " WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE'"
            " AND c.column_name IN ('run_id', 'conversation_id', 'thread_id', 'user_id',"
            " 'trace_id') GROUP BY c.table_name"
        )
        tables = {r["table_name"]: set(r["columns"]) for r in await cur.fetchall()}
        partitions = await conn.execute(
            "SELECT relid::regclass::text AS name FROM pg_partition_tree('run_events')"
            " WHERE relid::regclass::text <> 'run_events'"
        )
        tables = {
            name: cols
            for name, cols in tables.items()
            if name not in {r["name"] for r in await partitions.fetchall()}
        }
        for table, columns in sorted(tables.items()):
            if table in NOT_ERASED or table.startswith(("run_events_", "trace_span_sets_")):
                continue
            where = []
            if "run_id" in columns:
                where.append("run_id::text = ANY(%(runs)s)")
            if "conversation_id" in columns:
                where.append("conversation_id = ANY(%(convs)s)")
            if "thread_id" in columns:
                where.append("thread_id = ANY(%(convs)s)")
            if "user_id" in columns:
                where.append("user_id = %(user)s")
            if "trace_id" in columns:
                where.append("trace_id = ANY(%(traces)s)")
            cur = await conn.execute(
                f"SELECT count(*) AS n FROM {table} WHERE {' OR '.join(where)}",
                {"runs": runs, "convs": conversations, "user": user, "traces": traces},
            )
            row = await cur.fetchone()
            assert row is not None
            found[table] = int(row["n"])
        cur = await conn.execute(
            "SELECT count(*) AS n FROM store WHERE prefix = %s OR value->>'sourceRunId' = ANY(%s)",
            (f"acme.users.{user}.memories", runs),
        )
        row = await cur.fetchone()
        assert row is not None
        found["store"] = int(row["n"])
        found["conversations"] = await _count(
            conn, "SELECT count(*) AS n FROM conversations WHERE id = ANY(%s)", conversations
        )
        found["runs"] = await _count(
            conn, "SELECT count(*) AS n FROM runs WHERE id = ANY(%s)", runs
        )
    return found


async def _count(conn: Any, sql: str, ids: list[str]) -> int:
    cur = await conn.execute(sql, (ids,))
    row = await cur.fetchone()
    return int(row["n"])


async def test_erasing_a_user_removes_every_row_of_theirs_and_nothing_of_another(
    env: Env, pool: Pool
) -> None:
    alice = [await converse(env, "alice"), await converse(env, "alice", 1)]
    bob = [await converse(env, "bob")]
    alice_convs, alice_runs = [c for c, _ in alice], [r for _, rs in alice for r in rs]
    bob_convs, bob_runs = [c for c, _ in bob], [r for _, rs in bob for r in rs]
    before = await leftovers(pool, "alice", alice_convs, alice_runs)
    for table in ("run_events", "model_calls", "trace_span_sets", "checkpoints", "messages"):
        assert before[table] > 0, table  # the check can see these rows
    bob_before = await leftovers(pool, "bob", bob_convs, bob_runs)

    answer = await env.client.delete("/api/users/alice/data", headers=env.keys["ann"])

    assert answer.status_code == 200, answer.text
    assert answer.json()["counts"]["run_events"] == before["run_events"]
    assert {
        t: n for t, n in (await leftovers(pool, "alice", alice_convs, alice_runs)).items() if n
    } == {}
    assert await leftovers(pool, "bob", bob_convs, bob_runs) == bob_before
    assert (await env.client.get("/api/runs", headers=env.keys["alice"])).status_code == 401
    again = await env.client.delete("/api/users/alice/data", headers=env.keys["ann"])
    assert again.status_code == 200
    assert not any(again.json()["counts"].values())
    refused = await env.client.delete("/api/users/bob/data", headers=env.keys["carl"])
    assert refused.status_code == 403


async def test_erasing_a_conversation_keeps_the_users_other_data(env: Env, pool: Pool) -> None:
    (gone, gone_runs), (kept, kept_runs) = await converse(env, "bob"), await converse(env, "bob")
    c = env.client
    refused = await c.delete(f"/api/conversations/{gone}", headers=env.keys["carl"])
    assert refused.status_code == 403

    answer = await c.delete(f"/api/conversations/{gone}", headers=env.keys["bob"])

    assert answer.status_code == 200, answer.text
    left = await leftovers(pool, "nobody", [gone], gone_runs)
    assert {t: n for t, n in left.items() if n} == {}
    still = await leftovers(pool, "nobody", [kept], kept_runs)
    assert still["runs"] == 2 and still["run_events"] > 0 and still["checkpoints"] > 0
    async with pool.connection() as conn:  # the memory typed by hand was not learnt there
        cur = await conn.execute("SELECT key FROM store WHERE prefix = 'acme.users.bob.memories'")
        assert "manual-bob" in {r["key"] for r in await cur.fetchall()}
    again = await c.delete(f"/api/conversations/{gone}", headers=env.keys["bob"])
    assert again.json() == answer.json()
    assert (
        await c.delete("/api/conversations/conv_nope", headers=env.keys["bob"])
    ).status_code == 404
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM audit_log WHERE action = 'data.erased' AND target = %s",
            (f"conversation:{gone}",),
        )
        row = await cur.fetchone()
        assert row is not None and row["n"] == 1


async def test_erasure_refuses_while_a_run_is_in_progress_unless_asked_to_cancel(
    env: Env, pool: Pool
) -> None:
    c, headers = env.client, env.keys["carl"]
    conv = (await c.post("/api/conversations", json={}, headers=headers)).json()["conversationId"]
    run = (
        await c.post(
            f"/api/conversations/{conv}/messages",
            json={"content": "page", "model": "scripted:page"},
            headers=headers,
        )
    ).json()
    await wait_for_event(c, run["streamUrl"], "approval.required", headers=headers)
    await wait_for_status(c, run["runId"], "waiting_user", headers=headers)

    refused = await c.delete(f"/api/conversations/{conv}", headers=headers)
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "runs_active"
    assert run["runId"] in refused.json()["error"]["message"]
    assert (await c.get(f"/api/conversations/{conv}", headers=headers)).status_code == 200

    answer = await c.delete(
        f"/api/conversations/{conv}", params={"cancel": "true"}, headers=headers
    )
    assert answer.status_code == 200, answer.text
    assert (await c.get(f"/api/conversations/{conv}", headers=headers)).status_code == 404


class Crash(Exception):
    """Stands for the process dying between two steps."""


async def test_a_crash_in_the_middle_leaves_the_erasure_resumable_and_complete_on_retry(
    env: Env, pool: Pool
) -> None:
    convs = [await converse(env, "dora"), await converse(env, "dora")]
    conv_ids, run_ids = [c for c, _ in convs], [r for _, rs in convs for r in rs]
    before = await leftovers(pool, "dora", conv_ids, run_ids)
    admin = Principal("acme", "ann", frozenset({"admin"}))

    async def crash_after_checkpoints(step: str) -> None:
        if step == "checkpoints":
            raise Crash

    with pytest.raises(Crash):
        await erase_user(pool, admin, "dora", hook=crash_after_checkpoints)
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT status, done FROM erasures WHERE scope = 'user' AND subject = 'dora'"
        )
        (row,) = await cur.fetchall()
    assert row["status"] == "running" and row["done"]
    halfway = await leftovers(pool, "dora", conv_ids, run_ids)
    assert halfway["checkpoints"] < before["checkpoints"] and halfway["messages"] > 0

    erased = await erase_user(pool, admin, "dora")

    assert {t: n for t, n in (await leftovers(pool, "dora", conv_ids, run_ids)).items() if n} == {}
    assert erased.counts["run_events"] == before["run_events"]
    assert erased.counts["messages"] == before["messages"]
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM audit_log WHERE action = 'data.erased'"
            " AND target = 'user:dora'"
        )
        row = await cur.fetchone()
        assert row is not None and row["n"] == 1
