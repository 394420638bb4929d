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
from tests.integration.test_manifests_stored_once import (
    append_in_turn,
    assert_reads_give_back,
    stored_rows,
)
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


def on_every_path(call_id: str) -> Any:
    """Run a test once per append path, by the events `before` its own in the batch."""
    return pytest.mark.parametrize(
        "before",
        [
            [],  # one statement
            [usage_event(call_id)],  # a hooked batch: the pipelined transaction
            [NewEvent("note", {"n": n}) for n in range(80)],  # COPY
        ],
        ids=["statement", "hooked", "copy"],
    )


async def stored_completed(pool: Pool, run_id: str) -> dict[str, Any]:
    [data] = (await stored_rows(pool, run_id, EventType.RUN_COMPLETED)).values()
    return data


@on_every_path("mc_answer")
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


async def stored_items(pool: Pool, run_id: str) -> dict[str, dict[str, Any]]:
    rows = await stored_rows(pool, run_id, EventType.MESSAGE_ITEM_COMPLETED)
    return {data["itemId"]: data for data in rows.values()}


def item_events(item_id: str, pieces: list[str], text: str | None = None) -> list[NewEvent]:
    """An item streamed in `pieces`, then completed with `text` (theirs when None)."""
    return [
        NewEvent(EventType.MESSAGE_ITEM_CREATED, {"itemId": item_id, "role": "assistant"}),
        *[NewEvent(EventType.MESSAGE_ITEM_DELTA, {"itemId": item_id, "delta": p}) for p in pieces],
        NewEvent(
            EventType.MESSAGE_ITEM_COMPLETED,
            {
                "itemId": item_id,
                "text": "".join(pieces) if text is None else text,
                "status": "completed",
                "model": "scripted:x",
                "toolCalls": [],
            },
        ),
    ]


@on_every_path("mc_item")
async def test_the_answers_item_keeps_its_text_in_the_message_and_reads_give_it_back(
    pool: Pool, notifier: Notifier, before: list[NewEvent]
) -> None:
    run_id, generation, head = await started(pool)
    start = head.seq
    tail, _ = await following(pool, notifier, run_id, start)
    half = len(ANSWER) // 2
    streamed = item_events("item_answer", [ANSWER[:half], ANSWER[half:]])
    # An earlier item of another text, completed in the same batch: kept whole.
    other = item_events("item_other", ["thinking"])
    message_id = f"msg_item_{len(before)}_{run_id}"
    completed = NewEvent(EventType.RUN_COMPLETED, kept_answer(message_id, ANSWER))
    # The item's first piece in a batch of its own, the rest with the run's end.
    batches = [streamed[:2], [*other, *before, *streamed[2:], completed]]
    head, appended = await append_in_turn(
        pool,
        tail,
        head,
        generation,
        batches,
        lambda e: e.type != "note",
        extra=lambda number: storing(message_id, ANSWER) if number else None,
    )

    items = await stored_items(pool, run_id)
    assert items["item_answer"] == {
        "itemId": "item_answer",
        "status": "completed",
        "model": "scripted:x",
        "toolCalls": [],
        "storedIn": "messages",
        "textMessageId": message_id,
    }
    assert items["item_other"]["text"] == "thinking"
    assert head.snapshot["items"][0]["text"] == ANSWER
    # Live frames equal a replay byte for byte; reads and a folded head give back the text.
    await assert_reads_give_back(pool, notifier, tail, head, start, appended)


async def test_an_items_text_is_kept_in_the_log_unless_the_message_and_its_deltas_hold_it(
    pool: Pool,
) -> None:
    cases = {
        # The completion's text is the answer, but the deltas built another: kept whole, so
        # that a fold of the log gives the item the completion's text.
        "rewritten": (item_events("i", ["answer, almost"], "answer"), "answer", True),
        # The deltas' text, but not the answer's.
        "not the answer": (item_events("i", ["part"]), "part and more", True),
        # The answer's, but the run's end did not say its message holds it.
        "not kept": (item_events("i", ["answer"]), "answer", False),
    }
    for name, (events, output, kept) in cases.items():
        run_id, generation, head = await started(pool)
        data = (
            kept_answer("msg_" + run_id, output)
            if kept
            else {"outputMessageId": "msg_" + run_id, "output": output}
        )
        async with pool.connection() as conn:
            head, _ = await append_events(
                conn,
                run_id,
                [*events, NewEvent(EventType.RUN_COMPLETED, data)],
                generation=generation,
                head=head,
                extra=storing("msg_" + run_id, output),
            )
        assert "text" in (await stored_items(pool, run_id))["i"], name

    # A kept item whose message is gone (deleted by hand) reads as its stub.
    run_id, generation, head = await started(pool)
    async with pool.connection() as conn:
        head, _ = await append_events(
            conn,
            run_id,
            [
                *item_events("i", ["lost"]),
                NewEvent(EventType.RUN_COMPLETED, kept_answer("msg_gone", "lost")),
            ],
            generation=generation,
            head=head,
            extra=storing("msg_gone", "lost"),
        )
        await conn.execute("DELETE FROM messages WHERE id = 'msg_gone'")
        read = await read_events(conn, run_id, head.seq - 2, 9)
    assert json.loads(read[0][2])["data"]["textMessageId"] == "msg_gone"
    assert "text" not in json.loads(read[0][2])["data"]
