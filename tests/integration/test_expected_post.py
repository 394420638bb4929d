"""A message posted from what the process remembers: one round trip, or nothing stored.

`accept_expected` sends the check of what was remembered (the conversation's agent and
model, the profile's latest version) and the inserts with the `COMMIT`, in one sync; when
the check fails, the transaction rolls back whole and the caller posts the long way.
Counted with libpq's protocol trace on a pool of one connection.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from psycopg import pq
from psycopg.types.json import Jsonb

from server.auth import Principal
from server.db.pool import Pool, open_pool
from server.runs.conversations import create_conversation
from server.runs.records import Accepted, Expected, NewRun, accept_expected
from server.settings import Settings

pytestmark = pytest.mark.timeout(120)
WHO = Principal("t-expect", "u1")


@pytest.fixture(scope="module")
async def lone(settings: Settings, database_url: str, pool: Pool) -> AsyncIterator[Pool]:
    """A pool of one connection (on the migrated database), so that its traffic is traced."""
    one = settings.model_copy(update={"db_pool_min": 1, "db_pool_max": 1})
    async with open_pool(database_url, one) as p:
        yield p


async def traced(pool: Pool, block: Callable[[], Awaitable[Any]]) -> tuple[Any, list[str]]:
    """Run `block` with the protocol trace on the pool's one connection.

    Returns what it returned and the messages the client sent from the `BEGIN` on (a
    checkout's health check, if any, comes before it).
    """
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace"
        with path.open("w") as out:
            async with pool.connection() as conn:
                conn.pgconn.trace(out.fileno())
                conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            try:
                result = await block()
            finally:
                async with pool.connection() as conn:
                    conn.pgconn.untrace()
        lines = [line for line in path.read_text().splitlines() if line.startswith("F\t")]
    begin = next(n for n, line in enumerate(lines) if "BEGIN" in line)
    return result, [line.split("\t")[2] for line in lines[begin:]]


async def stored_for(pool: Pool, conversation_id: str) -> tuple[int, int]:
    """How many messages and runs the conversation holds."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM messages WHERE conversation_id = %(c)s) AS messages,"
            " (SELECT count(*) FROM runs WHERE conversation_id = %(c)s) AS runs",
            {"c": conversation_id},
        )
        row = await cur.fetchone()
    assert row is not None
    return row["messages"], row["runs"]


def new_run(conversation_id: str, agent: tuple[str, int] = ("default", 0)) -> NewRun:
    return NewRun(conversation_id, "hello", "demo", {}, agent=agent)


async def test_a_remembered_conversation_takes_one_sync(pool: Pool, lone: Pool) -> None:
    conversation = await create_conversation(pool, WHO, None, "demo", {})
    expected = Expected(None, "demo", "default", 0)  # no stored profile: the built-in one

    async def post() -> Accepted | None:
        return await accept_expected(lone, WHO, new_run(conversation["id"]), expected)

    accepted, sent = await traced(lone, post)
    assert accepted is not None and not accepted.replayed
    assert accepted.answer["status"] == "queued"
    assert accepted.created is not None and " run.created " in accepted.created
    assert sent.count("Sync") == 1, sent
    assert "Flush" not in sent[: sent.index("Sync")], sent  # nothing read before it
    assert await stored_for(pool, conversation["id"]) == (1, 1)


PROFILE = (
    "INSERT INTO agent_profiles (tenant_id, name, version, spec, source)"
    " VALUES (%s, %s, %s, %s, 'api')"
)


@pytest.mark.parametrize(
    ("expected", "change", "holds"),
    [
        # The profile has a newer version than the one remembered.
        (
            Expected(None, None, "support", 1),
            (PROFILE, ("support", 2)),
            Expected(None, None, "support", 2),
        ),
        # The profile was deleted: no version of it holds.
        (
            Expected(None, None, "temp", 1),
            ("UPDATE agent_profiles SET deleted_at = now() WHERE tenant_id = %s AND name = %s", ()),
            None,
        ),
        # The conversation is gone.
        (Expected(None, None, "default", 0), ("DELETE FROM conversations WHERE id = %s", ()), None),
        # Not the conversation remembered: its model differs.
        (Expected(None, "openai:gpt-4o", "default", 0), None, Expected(None, None, "default", 0)),
    ],
    ids=["newer-profile", "deleted-profile", "conversation-gone", "other-conversation"],
)
async def test_what_no_longer_holds_stores_nothing(
    pool: Pool,
    lone: Pool,
    expected: Expected,
    change: tuple[str, tuple[Any, ...]] | None,
    holds: Expected | None,
) -> None:
    conv = (await create_conversation(pool, WHO, None, None, {}))["id"]
    name = expected.agent_name
    async with pool.connection() as conn:
        if name != "default":
            await conn.execute(
                "DELETE FROM agent_profiles WHERE tenant_id = %s AND name = %s",
                (WHO.tenant_id, name),
            )
            await conn.execute(PROFILE, (WHO.tenant_id, name, 1, Jsonb({"name": name})))
        if change is not None:
            statement, extra = change
            if statement == PROFILE:
                params: tuple[Any, ...] = (WHO.tenant_id, extra[0], extra[1], Jsonb({}))
            elif "conversations" in statement:
                params = (conv,)
            else:
                params = (WHO.tenant_id, name)
            await conn.execute(statement, params)

    run = new_run(conv, (name, expected.agent_version))
    assert await accept_expected(lone, WHO, run, expected) is None
    assert await stored_for(pool, conv) == (0, 0)
    if holds is not None:  # the connection is sound, and what holds goes through
        run = new_run(conv, (holds.agent_name, holds.agent_version))
        assert await accept_expected(lone, WHO, run, holds) is not None
        assert await stored_for(pool, conv) == (1, 1)
