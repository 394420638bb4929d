"""A run's answer is stored once, in its message; the log's `run.completed` keeps a stub.

Every append path (one statement, the pipelined transaction with store hooks, COPY) stores
the stub with the message beside it; live frames and every read of the log give the event
back as it was appended, byte for byte.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from graphs.events import EventType
from server.db.pool import Conn, Pool
from server.events.answers import kept_answer
from server.events.log import NewEvent, RunHead, append_events, read_events
from server.events.notify import Notifier
from server.usage.ledger import MODEL_CALLS
from tests.integration.test_carried_notifications import following, notifier, started
from tests.integration.test_manifests_stored_once import assert_reads_give_back
from tests.integration.test_store_hooks import usage_event

pytestmark = pytest.mark.timeout(120)
__all__ = ["notifier"]  # the fixture, used by name

ANSWER = 'héllo 日本語 \u2028 "quoted" \\ back\nslash ' * 200


def storing(message_id: str, content: str) -> Any:
    """An append's `extra`: the run's answer as its message, as the run's end stores it."""

    async def store(conn: Conn, head: RunHead) -> None:
        await conn.execute(
            "INSERT INTO messages (id, conversation_id, tenant_id, user_id, run_id, role,"
            " content) SELECT %s, conversation_id, tenant_id, user_id, id, 'assistant', %s"
            " FROM runs WHERE id = %s",
            (message_id, content, head.run_id),
        )

    return store


async def stored_completed(pool: Pool, run_id: str) -> dict[str, Any]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT data FROM run_events WHERE run_id = %s AND type = 'run.completed'", (run_id,)
        )
        row = await cur.fetchone()
    assert row is not None
    return dict(row["data"])


@pytest.mark.parametrize(
    "before",
    [
        [],  # one statement
        [usage_event("mc_answer")],  # a hooked batch: the pipelined transaction
        [NewEvent("note", {"n": n}) for n in range(80)],  # COPY
    ],
    ids=["statement", "hooked", "copy"],
)
async def test_the_answer_is_stored_in_its_message_and_every_read_gives_it_back(
    pool: Pool, notifier: Notifier, before: list[NewEvent]
) -> None:
    run_id, generation, head = await started(pool)
    start = head.seq
    tail, _ = await following(pool, notifier, run_id, start)
    message_id = f"msg_answer_{len(before)}_{run_id}"
    completed = NewEvent(EventType.RUN_COMPLETED, kept_answer(message_id, ANSWER))
    async with pool.connection() as conn:
        head, stored = await append_events(
            conn,
            run_id,
            [*before, completed],
            generation=generation,
            head=head,
            hooks=[MODEL_CALLS],
            extra=storing(message_id, ANSWER),
        )
    await tail.until(head.seq)
    await asyncio.wait_for(tail.task, 60)

    # The log holds a stub; the message holds the answer.
    assert await stored_completed(pool, run_id) == {
        "outputMessageId": message_id,
        "storedIn": "messages",
    }
    appended = {stored[-1].seq: {"outputMessageId": message_id, "output": ANSWER}}
    await assert_reads_give_back(pool, notifier, tail, head, start, appended)


async def test_a_completion_not_kept_so_is_stored_whole_and_a_lost_message_reads_as_the_stub(
    pool: Pool,
) -> None:
    # Data made without `kept_answer`: the appender did not say the message holds it.
    run_id, generation, head = await started(pool)
    plain = {"outputMessageId": "msg_plain", "output": "an answer"}
    async with pool.connection() as conn:
        await append_events(
            conn,
            run_id,
            [NewEvent(EventType.RUN_COMPLETED, plain)],
            generation=generation,
            head=head,
        )
    assert await stored_completed(pool, run_id) == plain

    # Kept so, and its message gone (deleted by hand): the stub is what there is.
    run_id, generation, head = await started(pool)
    async with pool.connection() as conn:
        head, _ = await append_events(
            conn,
            run_id,
            [NewEvent(EventType.RUN_COMPLETED, kept_answer("msg_lost", "lost"))],
            generation=generation,
            head=head,
            extra=storing("msg_lost", "lost"),
        )
        await conn.execute("DELETE FROM messages WHERE id = 'msg_lost'")
        read = await read_events(conn, run_id, head.seq - 1, 9)
    assert [json.loads(wire)["data"] for _, _, wire in read] == [
        {"outputMessageId": "msg_lost", "storedIn": "messages"}
    ]
