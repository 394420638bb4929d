"""Retention: old runs keep record and snapshot while their events go with their partitions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.db.pool import Pool
from server.lifecycle.retention import apply_retention
from server.observability.metrics import Metrics
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import read_sse, serve, wait_for_event, wait_for_status
from tools.config import ToolConfig
from tools.spec import agent_tool

pytestmark = pytest.mark.timeout(240)
USAGE = {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}


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
    client: httpx.AsyncClient
    settings: Settings


@pytest.fixture(scope="module")
async def env(settings: Settings) -> AsyncIterator[Env]:
    config = ToolConfig.model_validate(
        {"tenants": {"default": {"tools": {"page": {"approval": "always"}}}}}
    )
    custom = settings.model_copy(
        update={
            "tool_config": config,
            "event_retention_days": 30,
            "span_retention_days": 14,
            "ledger_retention_days": 90,
            # Answers longer than this are cut in their span, the whole kept as a payload.
            "trace_payload_chars": 5,
            # These tests drop days beside a live server; a loaded machine must not defer them.
            "retention_lock_timeout_s": 60.0,
        }
    )
    app = create_app(custom, models=ModelRegistry(custom, SCRIPTS), tools=[page])
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        yield Env(client, custom)


async def start(env: Env, script: str) -> dict[str, Any]:
    conv = (await env.client.post("/api/conversations", json={})).json()["conversationId"]
    accepted: dict[str, Any] = (
        await env.client.post(
            f"/api/conversations/{conv}/messages",
            json={"content": "hi", "model": f"scripted:{script}"},
        )
    ).json()
    return accepted


async def count(pool: Pool, sql: str, *args: Any) -> int:
    async with pool.connection() as conn:
        cur = await conn.execute(sql, args)
        row = await cur.fetchone()
        assert row is not None
        return int(row["n"])


async def db_now(pool: Pool) -> Any:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT now() AS now")
        row = await cur.fetchone()
        assert row is not None
        return row["now"]


async def test_an_expired_run_keeps_record_and_snapshot_and_its_log_says_expired(
    env: Env, pool: Pool
) -> None:
    c = env.client
    old = await start(env, "hi")
    assert (await read_sse(c, old["streamUrl"]))[-1].event == "run.completed"
    waiting = await start(env, "page")
    before = await wait_for_event(c, waiting["streamUrl"], "approval.required")
    await wait_for_status(c, waiting["runId"], "waiting_user")
    assert await count(pool, "SELECT count(*) AS n FROM run_events WHERE run_id = %s", old["runId"])
    spans = await count(
        pool, "SELECT count(*) AS n FROM trace_spans WHERE run_id = %s", old["runId"]
    )
    assert spans > 1
    snapshot_before = (await c.get(f"/api/runs/{old['runId']}/snapshot")).json()
    metrics = Metrics()

    # A month and a day later, as the job sees it.
    later = await db_now(pool) + timedelta(days=31)
    removed = await apply_retention(pool, env.settings, metrics=metrics, now=later)

    assert removed is not None
    assert removed.expired_runs >= 1 and removed.events > 0 and removed.spans >= spans
    assert any(name.startswith("run_events_2") for name in removed.partitions_dropped)
    assert (
        await count(pool, "SELECT count(*) AS n FROM run_events WHERE run_id = %s", old["runId"])
        == 0
    )
    assert (
        await count(pool, "SELECT count(*) AS n FROM trace_spans WHERE run_id = %s", old["runId"])
        == 0
    )
    record = await c.get(f"/api/runs/{old['runId']}")
    assert record.status_code == 200 and record.json()["status"] == "completed"
    snapshot = await c.get(f"/api/runs/{old['runId']}/snapshot")
    assert snapshot.json() == snapshot_before
    assert snapshot.json()["output"] == "hello there"
    events = await c.get(f"/api/runs/{old['runId']}/events")
    assert events.status_code == 410
    assert events.json()["error"]["code"] == "events_expired"
    assert "snapshot" in events.json()["error"]["message"]
    sample = metrics.registry.get_sample_value(
        "agentrt_retention_removed_total", {"kind": "events"}
    )
    assert sample == removed.events

    # The run waiting for a decision kept every event (moved out of the dropped day), its
    # stream resumes after Last-Event-ID, and it goes on appending once approved.
    replay = await read_sse(c, waiting["streamUrl"], stop_after=len(before))
    assert [e.data for e in replay] == [e.data for e in before]
    resumed = await wait_for_event(
        c, waiting["streamUrl"], "approval.required", headers={"Last-Event-ID": "1"}
    )
    assert [e.id for e in resumed] == [e.id for e in before[1:]]
    rows = (await c.get(f"/api/runs/{waiting['runId']}/approvals")).json()["approvals"]
    await c.post(f"/api/approvals/{rows[0]['approvalId']}", json={"decision": "approve"})
    done = await read_sse(c, waiting["streamUrl"])
    assert done[-1].event == "run.completed"
    assert [int(e.id) for e in done] == list(range(1, len(done) + 1))  # gapless


async def test_ledger_rows_past_their_retention_are_rolled_up_per_day(env: Env, pool: Pool) -> None:
    run = await start(env, "hi")
    assert (await read_sse(env.client, run["streamUrl"]))[-1].event == "run.completed"
    calls = await count(pool, "SELECT count(*) AS n FROM model_calls")
    tokens = await count(pool, "SELECT COALESCE(sum(input_tokens), 0) AS n FROM model_calls")
    assert calls >= 1

    removed = await apply_retention(pool, env.settings, now=await db_now(pool) + timedelta(days=91))

    assert removed is not None and removed.ledger == calls
    assert await count(pool, "SELECT count(*) AS n FROM model_calls") == 0
    assert await count(pool, "SELECT sum(calls) AS n FROM model_usage_daily") == calls
    assert await count(pool, "SELECT sum(input_tokens) AS n FROM model_usage_daily") == tokens


async def test_only_one_process_applies_the_retention_at_a_time(env: Env, pool: Pool) -> None:
    async with pool.connection() as conn:
        await conn.execute("SELECT pg_advisory_lock(7262616020)")
        try:
            assert await apply_retention(pool, env.settings) is None
        finally:
            await conn.execute("SELECT pg_advisory_unlock(7262616020)")
    assert await apply_retention(pool, env.settings) is not None


async def test_a_tenant_with_a_shorter_retention_loses_its_logs_and_spans_sooner(
    env: Env, pool: Pool
) -> None:
    c = env.client
    answer = await c.put("/api/retention", json={"eventsDays": 2, "spansDays": 1})
    assert answer.status_code == 200, answer.text
    run = await start(env, "hi")
    assert (await read_sse(c, run["streamUrl"]))[-1].event == "run.completed"
    events = await count(
        pool, "SELECT count(*) AS n FROM run_events WHERE run_id = %s", run["runId"]
    )
    assert events > 0
    spans = await count(
        pool, "SELECT count(*) AS n FROM trace_spans WHERE run_id = %s", run["runId"]
    )
    assert spans > 1
    payloads = await count(
        pool,
        "SELECT count(*) AS n FROM trace_payloads p JOIN trace_spans s USING (trace_id, span_id)"
        " WHERE s.run_id = %s",
        run["runId"],
    )
    assert payloads >= 1  # "hello there" is longer than the 5 characters a span keeps
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT DISTINCT trace_id FROM trace_spans WHERE run_id = %s", (run["runId"],)
        )
        (trace_id,) = [r["trace_id"] for r in await cur.fetchall()]
    try:
        removed = await apply_retention(
            pool, env.settings, now=await db_now(pool) + timedelta(days=3)
        )
    finally:
        await c.put("/api/retention", json={})

    assert removed is not None
    sql = "SELECT count(*) AS n FROM {} WHERE run_id = %s"
    # Nothing old enough for the installation's 30 days: rows went, not partitions. Spans
    # are counted one by one, not by the sets that hold them.
    assert removed.partitions_dropped == [] and removed.events >= events
    assert removed.spans >= spans and removed.payloads >= payloads
    assert await count(pool, sql.format("run_events"), run["runId"]) == 0
    assert await count(pool, sql.format("trace_spans"), run["runId"]) == 0
    trace = await count(
        pool, "SELECT count(*) AS n FROM trace_payloads WHERE trace_id = %s", trace_id
    )
    assert trace == 0
    assert (await c.get(f"/api/runs/{run['runId']}/events")).status_code == 410
    assert (await c.get(f"/api/runs/{run['runId']}/snapshot")).json()["output"] == "hello there"


async def test_a_ledger_row_stays_while_the_events_that_point_at_it_do(
    env: Env, pool: Pool
) -> None:
    """A `usage` event keeps only a stub of its call: the row outlives a shorter ledger day."""
    c = env.client
    answer = await c.put("/api/retention", json={"ledgerDays": 1})
    assert answer.status_code == 200, answer.text
    try:
        run = await start(env, "hi")
        assert (await read_sse(c, run["streamUrl"]))[-1].event == "run.completed"
        sql = "SELECT count(*) AS n FROM model_calls WHERE run_id = %s"
        assert await count(pool, sql, run["runId"]) >= 1
        # Past the tenant's ledger day, within its events' 30: the row stays.
        await apply_retention(pool, env.settings, now=await db_now(pool) + timedelta(days=5))
        assert await count(pool, sql, run["runId"]) >= 1
        usage = [e for e in await read_sse(c, run["streamUrl"]) if e.event == "usage"]
        assert usage and all(e.data["data"]["call"]["model"] for e in usage)
        # Past both: rolled up.
        await apply_retention(pool, env.settings, now=await db_now(pool) + timedelta(days=31))
        assert await count(pool, sql, run["runId"]) == 0
    finally:
        await c.put("/api/retention", json={})
