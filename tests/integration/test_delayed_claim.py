"""A delayed run (`after_seconds`) is not claimed before its time, and is after it.

A module of its own, so its runs are the only ones in its database.
"""

from __future__ import annotations

import pytest

from server.auth import Principal
from server.db.pool import Pool
from server.runs.conversations import create_conversation
from server.runs.records import claim_next, create_run
from server.runs.worker import claim_params
from server.settings import Settings

pytestmark = pytest.mark.timeout(60)
WHO = Principal("t1", "u1")


async def test_a_delayed_run_is_claimed_only_once_its_time_has_come(
    pool: Pool, settings: Settings
) -> None:
    conv = await create_conversation(pool, WHO, None, None, {})
    later = await create_run(pool, WHO, conv["id"], "later", "demo", {}, after_s=3600)
    assert later.not_before is not None
    assert 3599 <= (later.not_before - later.created_at).total_seconds() <= 3601
    params = claim_params(settings, "test-worker")
    async with pool.connection() as conn, conn.transaction():
        nothing = await claim_next(conn, params)
    assert nothing is None  # the delayed run waits, though a worker is free
    async with pool.connection() as conn:  # its time comes (as it would after a restart)
        await conn.execute(
            "UPDATE runs SET not_before = now() - interval '1 second' WHERE id = %s", (later.id,)
        )
    async with pool.connection() as conn, conn.transaction():
        claimed = await claim_next(conn, params)
    assert claimed is not None and claimed.run.id == later.id
