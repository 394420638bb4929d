"""A claim reads what its attempt starts from: the profile version, tool config, thread state.

A module of its own, so the runs it creates are the only ones in its database.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage

from graphs.agent import build_agent_graph
from graphs.context import RunContext
from nodes.models.scripted import ScriptedChatModel, ScriptedTurn
from server.agents.profiles import AgentSpec
from server.agents.store import BUILTIN, create_profile, recorded_agent
from server.auth import Principal
from server.db.pool import Pool
from server.errors import AgentNotFoundError
from server.process import setup_checkpointer
from server.runs.conversations import create_conversation
from server.runs.records import Claim, claim_next, create_run
from server.runs.toolbox import overlay_of, store_overlay
from server.runs.worker import claim_params
from server.settings import Settings
from tools.config import TenantToolConfig

WHO = Principal("t1", "u1")


async def _claim(pool: Pool, settings: Settings) -> Claim:
    async with pool.connection() as conn, conn.transaction():
        claim = await claim_next(conn, claim_params(settings, "test-worker"))
    assert claim is not None
    return claim


async def test_a_new_threads_run_of_the_default_agent_needs_no_read(
    pool: Pool, settings: Settings
) -> None:
    conv = await create_conversation(pool, WHO, None, None, {})
    await create_run(pool, WHO, conv["id"], "hello", "demo", {})
    reads = (await _claim(pool, settings)).reads
    assert (reads.profile, reads.tool_config, reads.thread_stored) == (None, None, False)
    assert recorded_agent(reads.profile, "default", 0) is BUILTIN
    assert overlay_of(reads.tool_config) is None


async def test_a_claim_brings_the_profile_the_tool_config_and_the_threads_checkpoint(
    pool: Pool, settings: Settings
) -> None:
    spec = AgentSpec(instructions="Answer in French.")
    stored = await create_profile(pool, WHO.tenant_id, "french", spec, by="u1")
    await store_overlay(pool, WHO, TenantToolConfig(allow=["calculator"], deny=["shell*"]))
    conv = await create_conversation(pool, WHO, None, None, {})
    # The thread already holds a checkpoint, as after an earlier run of the conversation.
    graph = build_agent_graph().compile(checkpointer=await setup_checkpointer(pool))
    model = ScriptedChatModel(turns=[ScriptedTurn(text="bonjour")])
    await graph.ainvoke(
        {"messages": [HumanMessage("hi")], "run_id": "earlier", "step": 0},
        {"configurable": {"thread_id": conv["id"]}},
        context=RunContext(model=model),
    )
    await create_run(pool, WHO, conv["id"], "hello", "demo", {}, agent=("french", stored.version))

    claim = await _claim(pool, settings)
    assert claim.reads.thread_stored
    agent = recorded_agent(claim.reads.profile, *claim.run.agent)
    assert (agent.name, agent.version, agent.spec) == ("french", stored.version, spec)
    assert (agent.source, agent.created_by, agent.created_at) == (
        stored.source,
        "u1",
        stored.created_at,
    )
    overlay = overlay_of(claim.reads.tool_config)
    assert overlay is not None
    assert (overlay.allow, overlay.deny) == (["calculator"], ["shell*"])


async def test_a_version_removed_since_the_run_recorded_it_fails_as_before(
    pool: Pool, settings: Settings
) -> None:
    await create_profile(pool, WHO.tenant_id, "gone", AgentSpec(), by="u1")
    conv = await create_conversation(pool, WHO, None, None, {})
    await create_run(pool, WHO, conv["id"], "hello", "demo", {}, agent=("gone", 1))
    async with pool.connection() as conn:
        await conn.execute("DELETE FROM agent_profiles WHERE name = 'gone'")  # by hand
    claim = await _claim(pool, settings)
    assert claim.reads.profile is None
    with pytest.raises(AgentNotFoundError):
        recorded_agent(claim.reads.profile, *claim.run.agent)
