"""Starting children is exactly once: a replayed suspension finds its delegations."""

from __future__ import annotations

from dataclasses import replace

import pytest

from graphs.events import EventType
from graphs.subagent import Delegation
from server.auth import Principal
from server.db.pool import Pool
from server.domain import RunStatus
from server.events.log import NewEvent, append_events
from server.events.writer import EventWriter
from server.runs.conversations import create_conversation
from server.runs.records import Claim, claim_next, create_run
from server.runs.worker import claim_params
from server.settings import Settings
from server.subagents.results import delegation_rows
from server.subagents.spawn import start_children
from server.subagents.wake import report_to_parent

pytestmark = pytest.mark.timeout(60)
WHO = Principal("acme", "ann", frozenset())


def delegation(call_id: str, **extra: object) -> Delegation:
    base: Delegation = {
        "toolCallId": call_id,
        "agent": None,
        "task": f"task {call_id}",
        "expectedOutput": None,
        "outputSchema": None,
        "tools": None,
        "budgetShare": None,
        "onFailure": "tool_error",
    }
    return {**base, **extra}  # type: ignore[typeddict-item]


async def claimed_parent(pool: Pool, settings: Settings) -> Claim:
    conv = await create_conversation(pool, WHO, None, None, {})
    await create_run(pool, WHO, conv["id"], "go", "demo", {})
    async with pool.connection() as conn, conn.transaction():
        claim = await claim_next(conn, claim_params(settings, "test-worker"))
        assert claim is not None
        started = NewEvent(EventType.RUN_STARTED, {"attempt": 1, "worker": "w", "traceId": "t"})
        head, _ = await append_events(
            conn, claim.run.id, [started], generation=claim.run.lease_generation, head=claim.head
        )
    return replace(claim, head=head)


async def test_a_replayed_suspension_starts_no_second_child(pool: Pool, settings: Settings) -> None:
    claim = await claimed_parent(pool, settings)
    writer = EventWriter(pool, claim.head)
    asked = [delegation("c1"), delegation("c2"), delegation("c3", agent="nobody")]
    await start_children(pool, settings, writer, claim.run, asked)
    assert writer.head.status == RunStatus.WAITING_TOOL
    async with pool.connection() as conn:
        rows = await delegation_rows(conn, claim.run.id)
        cur = await conn.execute(
            "SELECT count(*) AS n, bool_and(lease_owner IS NULL) AS free FROM runs"
            " WHERE id = %s OR parent_run_id = %s",
            (claim.run.id, claim.run.id),
        )
        counted = await cur.fetchone()
    assert counted is not None and counted["n"] == 3 and counted["free"]
    assert rows["c3"]["child_run_id"] is None and "'nobody'" in rows["c3"]["refusal"]

    # The same step again (a replay): the recorded children are found, none is added.
    seq = writer.head.seq
    await start_children(pool, settings, writer, claim.run, asked)
    await writer.close()
    async with pool.connection() as conn:
        again = await delegation_rows(conn, claim.run.id)
        cur = await conn.execute(
            "SELECT type, data FROM run_events WHERE run_id = %s AND seq > %s ORDER BY seq",
            (claim.run.id, seq),
        )
        replayed = await cur.fetchall()
        cur = await conn.execute(
            "SELECT count(*) AS n FROM runs WHERE parent_run_id = %s", (claim.run.id,)
        )
        children = await cur.fetchone()
    assert {k: r["child_run_id"] for k, r in again.items()} == {
        k: r["child_run_id"] for k, r in rows.items()
    }
    assert children is not None and children["n"] == 2
    assert [(e["type"], e["data"].get("replayed")) for e in replayed] == [
        (EventType.SUBAGENT_STARTED, True),
        (EventType.SUBAGENT_STARTED, True),
    ]


async def test_the_per_parent_limit_refuses_the_extra_children(
    pool: Pool, settings: Settings
) -> None:
    claim = await claimed_parent(pool, settings)
    writer = EventWriter(pool, claim.head)
    limited = settings.model_copy(update={"subagent_max_children": 2})
    await start_children(pool, limited, writer, claim.run, [delegation(f"x{i}") for i in range(3)])
    await writer.close()
    async with pool.connection() as conn:
        rows = await delegation_rows(conn, claim.run.id)
    assert [r["child_run_id"] is not None for _, r in sorted(rows.items())] == [True, True, False]
    assert "at most 2 subagents" in rows["x2"]["refusal"]
    # Nothing ended yet: reporting to the parent adds nothing.
    assert await report_to_parent(pool, claim.run.id) == 0


async def test_depth_is_limited(pool: Pool, settings: Settings) -> None:
    claim = await claimed_parent(pool, settings)
    writer = EventWriter(pool, claim.head)
    flat = settings.model_copy(update={"subagent_max_depth": 0})
    await start_children(pool, flat, writer, claim.run, [delegation("d1")])
    await writer.close()
    assert writer.head.status == RunStatus.QUEUED  # refused at once: back to the queue
    async with pool.connection() as conn:
        rows = await delegation_rows(conn, claim.run.id)
    assert "AGENTRT_SUBAGENT_MAX_DEPTH" in rows["d1"]["refusal"]
