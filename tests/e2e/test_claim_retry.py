"""A claim that fails is tried again a second later, not at the worker's next poll.

The API and the worker run in separate app instances, as `agentrt serve --no-workers` and
`agentrt worker`; the worker polls only every 60 s. A trigger makes the first claim's
`run.started` insert fail once (a sequence counts, and a sequence is not rolled back), as a
lost connection or a restarting database would fail it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from nodes.models.scripted import ScriptedTurn
from server.app import create_app
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import post_in_new_conversation, serve, wait_for_status

SCRIPTS = {"quick": [ScriptedTurn(text="quick answer")]}

_FAULT = """
CREATE SEQUENCE test_claim_faults;
CREATE FUNCTION test_fail_first_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.type = 'run.started' AND nextval('test_claim_faults') = 1 THEN
        RAISE EXCEPTION 'test fault: the claim lost its connection' USING ERRCODE = '08006';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_fail_first_start BEFORE INSERT ON run_events
    FOR EACH ROW EXECUTE FUNCTION test_fail_first_start();
"""


@pytest.fixture(scope="module")
async def api_url(settings: Settings) -> AsyncIterator[str]:
    api_only = settings.model_copy(update={"run_workers": False})
    worker = settings.model_copy(update={"run_workers": True, "worker_poll_seconds": 60.0})
    async with (
        serve(create_app(api_only, models=ModelRegistry(api_only, SCRIPTS))) as url,
        serve(create_app(worker, models=ModelRegistry(worker, SCRIPTS))),
    ):
        yield url


async def test_a_failed_claim_is_tried_again_without_waiting_for_the_poll(
    api_url: str, pool: Pool
) -> None:
    async with pool.connection() as conn:
        await conn.execute(_FAULT, prepare=False)
    try:
        async with httpx.AsyncClient(base_url=api_url, timeout=30) as client:
            run = await post_in_new_conversation(client, "scripted:quick")
            await wait_for_status(client, run["runId"], "completed", limit_s=20)
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT last_value FROM test_claim_faults")
            row = await cur.fetchone()
        assert row is not None and row["last_value"] >= 2  # the fault did fail a claim
    finally:
        async with pool.connection() as conn:
            await conn.execute("DROP TRIGGER test_fail_first_start ON run_events")
