"""The lease sweep reads only the runs a worker holds, however many parents wait for children.

A parent waiting for its children is active (waiting_tool) but holds no lease. The sweep runs
every few seconds in every worker process, so it must not read those parents: `runs_held`
(migration 0036) holds only the runs with a lease.
"""

from __future__ import annotations

import json
from typing import Any

from server.db.pool import Pool
from server.runs.records import _EXPIRED_LEASES, lock_expired_leases

WAITING_PARENTS = 3000


async def test_the_sweep_reads_the_held_runs_only(pool: Pool) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO conversations (id, tenant_id, user_id) VALUES ('c_sweep', 't', 'u')"
        )
        for n, owner, expires in (
            (WAITING_PARENTS, None, None),
            (20, "w1", "now() + interval '1 minute'"),
            (3, "w2", "now() - interval '1 minute'"),
        ):
            await conn.execute(
                "INSERT INTO runs (id, conversation_id, tenant_id, user_id, model,"
                " input_message_id, status, lease_owner, lease_expires_at)"
                " SELECT 'run_' || gen_random_uuid(), 'c_sweep', 't', 'u' || (g %% 50), 'm',"
                f" 'msg', 'waiting_tool', %s, {expires or 'NULL'}"
                " FROM generate_series(1, %s) g",
                (owner, n),
            )
        await conn.execute("ANALYZE runs")

        async with conn.transaction():
            expired = await lock_expired_leases(conn)
        assert len(expired) == 3

        async with conn.transaction():
            cur = await conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + _EXPIRED_LEASES, (100,))
            row = await cur.fetchone()
        assert row is not None
        plan = row["QUERY PLAN"]
        plan = json.loads(plan) if isinstance(plan, str) else plan
        read = [n for n in _nodes(plan[0]["Plan"]) if n.get("Relation Name") == "runs"]
        assert [n.get("Index Name") for n in read] == ["runs_held"], read
        assert sum(n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0) for n in read) <= 23


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]
