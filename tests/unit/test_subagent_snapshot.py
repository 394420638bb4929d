"""The snapshot fold of subagent events, and the budget a child gets: pure functions."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from graphs.events import EventType as E
from nodes.models.usage import RunTotals
from server.domain import Run
from server.events.snapshot import apply_event, awaits_children, empty_snapshot
from server.settings import Settings
from server.subagents.spawn import child_budget, child_task
from tests.unit.test_run_record import row


def fold(events: list[tuple[E, dict[str, Any]]]) -> dict[str, Any]:
    snap = empty_snapshot("run_1")
    for seq, (kind, data) in enumerate([(E.RUN_STARTED, {"attempt": 1}), *events], start=1):
        apply_event(snap, seq, kind, data)
    return snap


def started(call: str) -> tuple[E, dict[str, Any]]:
    return E.SUBAGENT_STARTED, {
        "toolCallId": call,
        "childRunId": f"run_{call}",
        "agent": "a@1",
        "task": "t",
    }


def completed(call: str, status: str = "completed") -> tuple[E, dict[str, Any]]:
    data = {"toolCallId": call, "childRunId": f"run_{call}", "agent": "a@1", "status": status}
    return E.SUBAGENT_COMPLETED, {**data, "summary": "", "error": None, "usage": {}}


def test_a_parent_waits_for_every_child_then_goes_back_to_the_queue() -> None:
    snap = fold([started("a"), started("b")])
    assert snap["status"] == "waiting_tool" and awaits_children(snap)
    snap = fold([started("a"), started("b"), completed("a")])
    assert snap["status"] == "waiting_tool"
    snap = fold([started("a"), started("b"), completed("a"), completed("b", "failed")])
    assert snap["status"] == "queued" and not awaits_children(snap)
    assert [(c["toolCallId"], c["status"]) for c in snap["children"]] == [
        ("a", "completed"),
        ("b", "failed"),
    ]


def test_a_retried_child_is_awaited_again_and_a_replayed_start_adds_no_row() -> None:
    snap = fold(
        [started("a"), started("b"), completed("a", "cancelled"), started("a"), started("a")]
    )
    assert snap["status"] == "waiting_tool"
    assert [(c["toolCallId"], c["status"]) for c in snap["children"]] == [
        ("a", "running"),
        ("b", "running"),
    ]


def test_refused_delegations_send_a_running_parent_back_to_the_queue() -> None:
    snap = fold([completed("x", "refused")])
    assert snap["status"] == "queued"


def test_a_child_gets_its_share_of_what_the_parent_has_left() -> None:
    parent = Run.from_row(row(options={"maxCost": 1, "maxTokens": 1000}))
    spent = RunTotals(input_tokens=300, output_tokens=100, known_cost=Decimal("0.2"))
    budget = child_budget(parent, Settings(_env_file=None), spent, 0.5)  # type: ignore[call-arg]
    assert budget == {"maxCost": "0.4", "maxTokens": 300}
    empty = RunTotals(input_tokens=1000)
    assert "no maxTokens budget left" in str(
        child_budget(parent, Settings(_env_file=None), empty, None)
    )  # type: ignore[call-arg]


def test_the_child_is_told_the_expected_output_and_schema() -> None:
    text = child_task(
        {
            "toolCallId": "c",
            "agent": None,
            "task": "Count.",
            "expectedOutput": "a number",
            "outputSchema": {"type": "integer"},
            "tools": None,
            "budgetShare": None,
            "onFailure": "tool_error",
        }
    )
    assert text.startswith("Count.\n\nExpected output: a number\n\nAnswer with a single JSON")
    assert '"type": "integer"' in text
