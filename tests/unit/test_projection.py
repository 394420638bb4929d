"""The projector re-emits answers a crashed attempt checkpointed but never logged."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from server.events.projection import StreamProjector


def test_answers_missing_from_the_log_are_replayed_under_new_item_ids() -> None:
    emitted: list[tuple[str, dict[str, Any]]] = []
    projector = StreamProjector(lambda kind, data=None: emitted.append((kind, data or {})))
    messages = [
        HumanMessage("earlier run", id="m0"),
        AIMessage("old answer", id="a0"),
        HumanMessage("go", id="m1"),
        AIMessage("Checking.", id="a1", tool_calls=[{"name": "t", "args": {}, "id": "c1"}]),
        ToolMessage("ok", tool_call_id="c1"),
        AIMessage("The answer is 42.", id="a2"),
    ]

    projector.replay_missing(messages, since_id="m1", recorded={"a1"})

    assert [k for k, _ in emitted] == [
        "message.item.created",
        "message.item.delta",
        "message.item.completed",
    ]
    assert {d["itemId"] for _, d in emitted} == {"a2~replayed"}
    assert emitted[1][1]["delta"] == "The answer is 42."
    assert emitted[2][1]["text"] == "The answer is 42."


def test_nothing_is_replayed_when_the_log_has_every_answer() -> None:
    emitted: list[str] = []
    projector = StreamProjector(lambda kind, data=None: emitted.append(kind))
    messages = [HumanMessage("go", id="m1"), AIMessage("Done.", id="a1")]
    projector.replay_missing(messages, since_id="m1", recorded={"a1"})
    assert emitted == []


def test_an_answer_already_replayed_is_not_replayed_again() -> None:
    emitted: list[str] = []
    projector = StreamProjector(lambda kind, data=None: emitted.append(kind))
    messages = [HumanMessage("go", id="m1"), AIMessage("Done.", id="a1")]
    projector.replay_missing(messages, since_id="m1", recorded={"a1~replayed"})
    assert emitted == []


def test_logged_answers_the_checkpoint_lacks_are_superseded() -> None:
    emitted: list[tuple[str, dict[str, Any]]] = []
    projector = StreamProjector(lambda kind, data=None: emitted.append((kind, data or {})))
    messages = [HumanMessage("go", id="m1"), AIMessage("Kept.", id="a1")]

    projector.supersede_unsaved(messages, since_id="m1", recorded={"a1~replayed", "lost"})

    assert [(k, d["itemId"], d["status"]) for k, d in emitted] == [
        ("message.item.completed", "lost", "superseded")
    ]


def test_every_logged_answer_is_superseded_when_the_run_has_no_checkpoint() -> None:
    emitted: list[str] = []
    projector = StreamProjector(
        lambda kind, data=None: emitted.append(data["itemId"] if data else "")
    )
    projector.supersede_unsaved([], since_id="m1", recorded={"a1", "a2"})
    assert emitted == ["a1", "a2"]


def test_an_answer_restored_on_resume_is_emitted_once_under_an_unused_id() -> None:
    emitted: list[tuple[str, dict[str, Any]]] = []
    logged = {"a1": "completed", "a2": "superseded"}
    projector = StreamProjector(lambda kind, data=None: emitted.append((kind, data or {})), logged)

    for message in (AIMessage("Logged.", id="a1"), AIMessage("Cut off.", id="a2")):
        projector.handle("updates", {"call_model": {"messages": [message]}})

    assert {d["itemId"] for _, d in emitted} == {"a2~replayed"}
    assert emitted[-1][1]["text"] == "Cut off."
