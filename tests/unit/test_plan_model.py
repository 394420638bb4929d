"""The plan's pure functions, and the plan and execution view in the snapshot fold."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from server.events.log import NewEvent, RunHead, fold_events
from server.events.snapshot import apply_event, empty_snapshot
from tools.plan.model import PlanError, changes, close_plan, update_plan

STEPS = [{"title": "Find sources"}, {"title": "Fetch them"}, {"title": "Write"}]


def test_create_mark_and_replace_make_new_revisions() -> None:
    plan = update_plan(None, "r", "create", steps=STEPS)
    assert [s["id"] for s in plan["steps"]] == ["1", "2", "3"] and plan["revision"] == 1
    marked = update_plan(plan, "r", "mark", step_id="2", status="running", notes="3 pages")
    assert marked["steps"][1] == {
        "id": "2",
        "title": "Fetch them",
        "status": "running",
        "notes": "3 pages",
    }
    assert plan["steps"][1]["status"] == "pending"  # the given plan is left alone
    assert changes(plan, marked) == [
        {"id": "2", "change": "status", "from": "pending", "to": "running"},
        {"id": "2", "change": "notes", "from": "", "to": "3 pages"},
    ]
    replaced = update_plan(marked, "r", "replace", steps=["Only step"])
    assert replaced["revision"] == 3
    assert {c["change"] for c in changes(marked, replaced)} == {"title", "removed"}


@pytest.mark.parametrize(
    ("action", "kwargs", "message"),
    [
        ("create", {"steps": STEPS}, "a plan already exists"),
        ("mark", {"step_id": "7", "status": "done"}, "one of the plan's step ids: 1, 2, 3"),
        ("mark", {"step_id": "1"}, "new status, its notes"),
        ("replace", {"steps": []}, "give the plan's steps"),
        ("replace", {"steps": [{"title": "a", "id": "x"}, {"title": "b", "id": "x"}]}, "unique"),
        ("drop", {}, "must be 'create', 'replace' or 'mark'"),
    ],
)
def test_updates_that_do_not_fit_say_what_would(
    action: str, kwargs: dict[str, Any], message: str
) -> None:
    plan = update_plan(None, "r", "create", steps=STEPS)
    with pytest.raises(PlanError, match=message):
        update_plan(plan, "r", action, **kwargs)


def test_a_failed_run_fails_its_running_step_and_a_cancelled_one_skips_the_rest() -> None:
    plan = update_plan(None, "r", "create", steps=STEPS)
    plan = update_plan(plan, "r", "mark", step_id="1", status="done")
    plan = update_plan(plan, "r", "mark", step_id="2", status="running")
    failed = close_plan(plan, "failed")
    assert failed is not None
    assert [s["status"] for s in failed["steps"]] == ["done", "failed", "pending"]
    cancelled = close_plan(plan, "cancelled")
    assert cancelled is not None
    assert [s["status"] for s in cancelled["steps"]] == ["done", "skipped", "skipped"]
    done = update_plan(plan, "r", "mark", step_id="2", status="done")
    done = update_plan(done, "r", "mark", step_id="3", status="done")
    assert close_plan(done, "cancelled") is None


def _plan_event(plan: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "plan.updated", {"plan": plan, "changed": [], "reason": "tool"}


def test_the_execution_view_joins_the_running_step_and_the_runtime_status() -> None:
    plan = update_plan(None, "r", "create", steps=STEPS)
    plan = update_plan(plan, "r", "mark", step_id="2", status="running")
    snap = empty_snapshot("r")
    events: list[tuple[str, dict[str, Any]]] = [
        ("run.created", {}),
        ("run.started", {"attempt": 1}),
        _plan_event(plan),
        ("tool.started", {"toolCallId": "a", "name": "fetch_url", "args": {}}),
    ]
    for seq, (kind, data) in enumerate(events, start=1):
        apply_event(snap, seq, kind, data)
    assert snap["plan"] == plan
    assert snap["execution"] == {
        "status": "waiting_tool",
        "step": {"id": "2", "title": "Fetch them"},
        "waitingOn": {"kind": "tool", "names": ["fetch_url"]},
        "planRevision": 2,
        "text": "step 2 (Fetch them) running; run waiting_tool on fetch_url",
    }
    apply_event(snap, 5, "tool.completed", {"toolCallId": "a", "name": "fetch_url"})
    assert snap["execution"]["status"] == "running" and snap["execution"]["waitingOn"] is None


def test_a_cancel_stored_after_a_plan_is_preceded_by_the_plan_it_closes() -> None:
    plan = update_plan(None, "r", "create", steps=STEPS)
    plan = update_plan(plan, "r", "mark", step_id="1", status="running")
    head = RunHead("r", 0, "queued", 0, empty_snapshot("r"), 1)
    head, stored = fold_events(
        head,
        [
            NewEvent("run.created", {}),  # type: ignore[arg-type]
            NewEvent("run.started", {"attempt": 1}),  # type: ignore[arg-type]
            NewEvent("plan.updated", {"plan": plan, "changed": [], "reason": "tool"}),  # type: ignore[arg-type]
            NewEvent("run.cancelled", {"reason": "cancel requested"}),  # type: ignore[arg-type]
        ],
        datetime.now(UTC),
    )
    assert [e.type for e in stored] == [
        "run.created",
        "run.started",
        "plan.updated",
        "plan.updated",
        "run.cancelled",
    ]
    assert stored[3].data["reason"] == "run.cancelled"
    assert [s["status"] for s in head.snapshot["plan"]["steps"]] == ["skipped"] * 3
    assert [e.seq for e in stored] == [1, 2, 3, 4, 5]
    assert head.snapshot["execution"]["status"] == "cancelled"


def test_a_failure_stored_after_a_plan_fails_its_running_step_only() -> None:
    plan = update_plan(None, "r", "create", steps=STEPS)
    plan = update_plan(plan, "r", "mark", step_id="1", status="done")
    plan = update_plan(plan, "r", "mark", step_id="2", status="running")
    head = RunHead("r", 0, "queued", 0, empty_snapshot("r"), 1)
    events = [
        NewEvent("run.created", {}),  # type: ignore[arg-type]
        NewEvent("run.started", {"attempt": 1}),  # type: ignore[arg-type]
        NewEvent("plan.updated", {"plan": plan, "changed": [], "reason": "tool"}),  # type: ignore[arg-type]
        NewEvent("run.failed", {"errorType": "step_limit", "message": "too many"}),  # type: ignore[arg-type]
    ]
    head, stored = fold_events(head, events, datetime.now(UTC))
    closing = stored[3]
    assert closing.type == "plan.updated" and closing.data["reason"] == "run.failed"
    assert closing.data["changed"] == [
        {"id": "2", "change": "status", "from": "running", "to": "failed"}
    ]
    assert [s["status"] for s in head.snapshot["plan"]["steps"]] == ["done", "failed", "pending"]
    # A run without a plan stores its end alone.
    bare, stored = fold_events(
        RunHead("q", 0, "queued", 0, empty_snapshot("q"), 1),
        events[:2] + events[3:],
        datetime.now(UTC),
    )
    assert [e.type for e in stored] == ["run.created", "run.started", "run.failed"]
    assert "plan" not in bare.snapshot and "execution" not in bare.snapshot
