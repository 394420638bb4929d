"""The snapshot is a fold of the event log: status, items, output and tool calls."""

from __future__ import annotations

from typing import Any

import pytest

from server.errors import IllegalTransitionError
from server.events.snapshot import apply_event, empty_snapshot, output_text, streaming_item_ids


def fold(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    snap = empty_snapshot("run_x")
    for seq, (kind, data) in enumerate(events, start=1):
        apply_event(snap, seq, kind, data)
    return snap


def test_tool_calls_move_status_through_waiting_tool_and_back() -> None:
    snap = fold([("run.created", {}), ("run.started", {"attempt": 1})])
    apply_event(snap, 3, "tool.started", {"toolCallId": "a", "name": "t", "args": {}})
    apply_event(snap, 4, "tool.started", {"toolCallId": "b", "name": "t", "args": {}})
    assert snap["status"] == "waiting_tool"
    apply_event(snap, 5, "tool.completed", {"toolCallId": "a", "name": "t", "durationMs": 1})
    assert snap["status"] == "waiting_tool"  # b still runs
    apply_event(snap, 6, "tool.failed", {"toolCallId": "b", "name": "t", "error": "boom"})
    assert snap["status"] == "running"
    assert [(t["toolCallId"], t["status"]) for t in snap["toolCalls"]] == [
        ("a", "completed"),
        ("b", "failed"),
    ]
    assert snap["lastEventId"] == 6 and snap["attempt"] == 1


def test_superseded_items_are_left_out_of_the_output() -> None:
    snap = fold(
        [
            ("run.created", {}),
            ("run.started", {"attempt": 1}),
            ("message.item.created", {"itemId": "i1"}),
            ("message.item.delta", {"itemId": "i1", "delta": "partial"}),
        ]
    )
    assert streaming_item_ids(snap) == ["i1"]
    assert output_text(snap) == "partial"
    apply_event(snap, 5, "message.item.completed", {"itemId": "i1", "status": "superseded"})
    apply_event(snap, 6, "message.item.created", {"itemId": "i2"})
    apply_event(snap, 7, "message.item.delta", {"itemId": "i2", "delta": "Hello"})
    apply_event(snap, 8, "message.item.completed", {"itemId": "i2", "text": "Hello"})
    assert output_text(snap) == "Hello"
    assert streaming_item_ids(snap) == []


def test_an_event_after_the_end_is_an_illegal_transition() -> None:
    snap = fold([("run.created", {}), ("run.started", {}), ("run.completed", {})])
    with pytest.raises(IllegalTransitionError):
        apply_event(snap, 4, "run.started", {})


def test_completing_a_queued_run_is_refused() -> None:
    with pytest.raises(IllegalTransitionError):
        fold([("run.created", {}), ("run.completed", {})])


APPROVAL = {"approvalId": "apr_1", "toolCallId": "c1", "name": "launch_rocket", "risk": "high"}


def test_a_paused_run_resumes_to_the_queue_when_nothing_waits_for_a_person() -> None:
    snap = fold([("run.created", {}), ("run.started", {"attempt": 1}), ("run.paused", {})])
    assert snap["status"] == "paused"
    apply_event(snap, 4, "run.resumed", {})
    assert snap["status"] == "queued"


def test_a_decision_made_while_paused_is_kept_and_the_run_stays_paused() -> None:
    snap = fold(
        [
            ("run.created", {}),
            ("run.started", {"attempt": 1}),
            ("approval.required", APPROVAL),
            ("run.paused", {"from": "waiting_user"}),
            ("approval.resolved", {"approvalId": "apr_1", "status": "approved", "by": "rita"}),
        ]
    )
    assert snap["status"] == "paused"
    assert snap["approvals"][0]["status"] == "approved"
    apply_event(snap, 6, "run.resumed", {})
    assert snap["status"] == "queued"


def test_a_run_paused_while_waiting_resumes_to_waiting_for_its_reviewer() -> None:
    snap = fold(
        [
            ("run.created", {}),
            ("run.started", {"attempt": 1}),
            ("approval.required", APPROVAL),
            ("run.paused", {"from": "waiting_user"}),
        ]
    )
    assert snap["status"] == "paused"
    apply_event(snap, 5, "run.resumed", {})
    assert snap["status"] == "waiting_user"
    assert snap["approvals"][0]["status"] == "pending"


def test_a_paused_run_cannot_be_started_by_a_worker() -> None:
    snap = fold([("run.created", {}), ("run.paused", {})])
    with pytest.raises(IllegalTransitionError):
        apply_event(snap, 3, "run.started", {"attempt": 1})
