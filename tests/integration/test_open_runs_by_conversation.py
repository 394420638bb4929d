"""A conversation's runs in progress are found without reading its finished ones.

A module of its own, so the runs it creates are the only ones in its database.
"""

from __future__ import annotations

import json

import pytest

from server.auth import Principal
from server.db.pool import Pool
from server.errors import ConversationBusyError
from server.runs.conversations import create_conversation
from server.runs.records import Claim, claim_next, claim_statement, create_run
from server.runs.worker import claim_params
from server.settings import Settings

WHO = Principal("t1", "u1")
FINISHED = 300

pytestmark = pytest.mark.timeout(120)


async def _claim(pool: Pool, settings: Settings) -> Claim | None:
    async with pool.connection() as conn, conn.transaction():
        return await claim_next(conn, claim_params(settings, "test-worker"))


async def _with_finished_runs(pool: Pool) -> str:
    """A conversation that has had many runs, all finished."""
    conv = await create_conversation(pool, WHO, None, None, {})
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model, input_message_id,"
            " status, finished_at, created_at, last_event_seq)"
            " SELECT 'run_done_' || %(c)s || '_' || n, %(c)s, %(t)s, %(u)s, 'demo', 'msg', s,"
            " now(), now() - make_interval(mins => n), 3"
            " FROM generate_series(1, %(n)s) n,"
            " LATERAL (SELECT (ARRAY['completed', 'failed', 'cancelled'])[1 + n %% 3] AS s) x",
            {"c": conv["id"], "t": WHO.tenant_id, "u": WHO.user_id, "n": FINISHED},
        )
        await conn.execute("ANALYZE runs")
    return str(conv["id"])


async def test_a_queued_run_waits_for_the_run_in_progress_not_for_finished_ones(
    pool: Pool, settings: Settings
) -> None:
    conv = await _with_finished_runs(pool)
    first = await create_run(pool, WHO, conv, "one", "demo", {})
    second = await create_run(pool, WHO, conv, "two", "demo", {})
    claim = await _claim(pool, settings)
    assert claim is not None
    assert claim.run.id == first.id
    # The first waits for its user: in progress, with no worker. The second still waits.
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE runs SET status = 'waiting_user', lease_owner = NULL WHERE id = %s",
            (first.id,),
        )
    assert await _claim(pool, settings) is None
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE runs SET status = 'completed', finished_at = now() WHERE id = %s",
            (first.id,),
        )
    claim = await _claim(pool, settings)
    assert claim is not None
    assert claim.run.id == second.id


async def test_a_busy_conversation_is_refused_by_its_run_in_progress(pool: Pool) -> None:
    conv = await _with_finished_runs(pool)
    assert (await create_run(pool, WHO, conv, "one", "demo", {}, if_busy="reject")).id
    with pytest.raises(ConversationBusyError):
        await create_run(pool, WHO, conv, "two", "demo", {}, if_busy="reject")


async def test_the_claim_reads_a_conversations_runs_in_progress_by_their_index(
    pool: Pool, settings: Settings
) -> None:
    await _with_finished_runs(pool)
    statement = claim_statement(claim_params(settings, "test-worker"))
    async with pool.connection() as conn:
        cur = await conn.execute("EXPLAIN (FORMAT JSON) " + statement)
        plan = json.dumps((await cur.fetchone())["QUERY PLAN"])
    assert '"Index Name": "runs_open_by_conversation"' in plan
    assert '"Index Name": "runs_conversation"' not in plan
