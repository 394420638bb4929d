"""The run snapshot: a pure projection of the event log.

`apply_event` folds one event into a snapshot. The event writer applies it to every event in
the same transaction that stores the event, so the stored snapshot and the log always agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from graphs.events import EventType
from server.domain import ACTIVE, RunStatus, check_transition
from server.events import calls
from server.events.plans import execution_view, fold_plan

Snapshot = dict[str, Any]
Data = Mapping[str, Any]
E = EventType

_STATUS_BY_EVENT: dict[str, RunStatus] = {
    E.RUN_CREATED: RunStatus.QUEUED,
    E.RUN_STARTED: RunStatus.RUNNING,
    E.RUN_REQUEUED: RunStatus.QUEUED,
    E.APPROVAL_REQUIRED: RunStatus.WAITING_USER,
    E.RUN_COMPLETED: RunStatus.COMPLETED,
    E.RUN_FAILED: RunStatus.FAILED,
    E.RUN_CANCELLED: RunStatus.CANCELLED,
    E.RUN_PAUSED: RunStatus.PAUSED,
}
ITEM_SEPARATOR = "\n\n"


def empty_snapshot(run_id: str) -> Snapshot:
    """Return the snapshot of a run before its first event."""
    return {
        "runId": run_id,
        "status": RunStatus.QUEUED.value,
        "lastEventId": 0,
        "attempt": 0,
        "items": [],
        "toolCalls": [],
        "approvals": [],
        "error": None,
    }


def copy_snapshot(snap: Snapshot) -> Snapshot:
    """Copy `snap` deeply enough that `apply_event` on the copy leaves `snap` unchanged.

    `apply_event` only appends rows to `items`, `toolCalls` and `approvals`, sets keys of those
    rows and of the snapshot, and replaces (never mutates) anything below; so the containers
    are copied and the values (long texts, tool arguments) are shared.
    """
    copy = {
        **snap,
        "items": [dict(i) for i in snap["items"]],
        "toolCalls": [dict(t) for t in snap["toolCalls"]],
    }
    if "approvals" in snap:
        copy["approvals"] = [dict(a) for a in snap["approvals"]]
    if "children" in snap:
        copy["children"] = [dict(c) for c in snap["children"]]
    return copy


def _find(rows: list[Any], key: str, value: str) -> Any:
    for row in reversed(rows):  # the row we want is nearly always the newest
        if row[key] == value:
            return row
    return None


def _pending(snap: Snapshot) -> bool:
    return any(a["status"] == "pending" for a in snap.get("approvals", []))


def _after_resume(snap: Snapshot, current: RunStatus) -> RunStatus:
    # Back where it waits: for a reviewer while approvals are pending, else for a worker.
    return RunStatus.WAITING_USER if _pending(snap) else RunStatus.QUEUED


def _after_decision(snap: Snapshot, current: RunStatus) -> RunStatus:
    if current == RunStatus.WAITING_USER and not _pending(snap):
        return RunStatus.QUEUED
    return current


def _after_tool_start(snap: Snapshot, current: RunStatus) -> RunStatus:
    return RunStatus.WAITING_TOOL if current == RunStatus.RUNNING else current


def _after_tool_end(snap: Snapshot, current: RunStatus) -> RunStatus:
    if current != RunStatus.WAITING_TOOL:
        return current
    tools_running = any(t["status"] == "running" for t in snap["toolCalls"])
    return RunStatus.WAITING_TOOL if tools_running else RunStatus.RUNNING


def awaits_children(snap: Snapshot) -> bool:
    """Say whether the run waits for a child run it delegated to (docs/subagents.md)."""
    return any(c["status"] == "running" for c in snap.get("children", []))


def _after_child_started(snap: Snapshot, current: RunStatus) -> RunStatus:
    return RunStatus.WAITING_TOOL if current in ACTIVE else current


def _after_child_ended(snap: Snapshot, current: RunStatus) -> RunStatus:
    # The last awaited child ended: the parent goes back to the queue to resume.
    if current in ACTIVE and not awaits_children(snap):
        return RunStatus.QUEUED
    return current


# Event types whose next status depends on the snapshot (after the event is folded in).
_STATUS_RULES: dict[str, Callable[[Snapshot, RunStatus], RunStatus]] = {
    E.RUN_RESUMED: _after_resume,
    E.APPROVAL_RESOLVED: _after_decision,
    E.TOOL_STARTED: _after_tool_start,
    E.TOOL_COMPLETED: _after_tool_end,
    E.TOOL_FAILED: _after_tool_end,
    E.SUBAGENT_STARTED: _after_child_started,
    E.SUBAGENT_COMPLETED: _after_child_ended,
}


def _next_status(snap: Snapshot, kind: str) -> RunStatus:
    fixed = _STATUS_BY_EVENT.get(kind)
    if fixed is not None:
        return fixed
    current = RunStatus(snap["status"])
    rule = _STATUS_RULES.get(kind)
    return current if rule is None else rule(snap, current)


def _run_started(snap: Snapshot, data: Data) -> None:
    snap["attempt"] = data.get("attempt", snap["attempt"])


def find_item(snap: Snapshot, item_id: Any) -> Any:
    """The snapshot's item `item_id` (the newest, should there be two), or None."""
    return _find(snap["items"], "itemId", item_id)


def _item_created(snap: Snapshot, data: Data) -> None:
    item = {"itemId": data["itemId"], "role": data.get("role", "assistant")}
    snap["items"].append({**item, "text": "", "status": "streaming"})


def _item_delta(snap: Snapshot, data: Data) -> None:
    item = find_item(snap, data["itemId"])
    if item is not None:
        item["text"] += data["delta"]


def _item_completed(snap: Snapshot, data: Data) -> None:
    item = find_item(snap, data["itemId"])
    if item is not None:
        item["text"] = data.get("text", item["text"])
        item["status"] = data.get("status", "completed")


def _tool_started(snap: Snapshot, data: Data) -> None:
    # A replay after a crash starts the same call again: one row per call id.
    call = _find(snap["toolCalls"], "toolCallId", data["toolCallId"])
    if call is None:
        call = {"toolCallId": data["toolCallId"]}
        snap["toolCalls"].append(call)
    call.update({"name": data["name"], "args": data.get("args", {}), "status": "running"})
    call.pop("error", None)


def _tool_completed(snap: Snapshot, data: Data) -> None:
    call = _find(snap["toolCalls"], "toolCallId", data["toolCallId"])
    if call is not None:
        call["status"] = "completed"
        call["durationMs"] = data.get("durationMs")


def _tool_failed(snap: Snapshot, data: Data) -> None:
    call = _find(snap["toolCalls"], "toolCallId", data["toolCallId"])
    if call is not None:
        call["status"] = "failed"
        call["durationMs"] = data.get("durationMs")
        call["error"] = data.get("error")
        call["errorType"] = data.get("errorType")


def _approval_required(snap: Snapshot, data: Data) -> None:
    approvals = snap.setdefault("approvals", [])
    entry = _find(approvals, "approvalId", data["approvalId"])
    if entry is None:
        entry = {"approvalId": data["approvalId"]}
        approvals.append(entry)
    entry.update(
        {
            "kind": data.get("kind", "approval"),
            "toolCallId": data["toolCallId"],
            "name": data["name"],
            "risk": data.get("risk"),
            "status": "pending",
        }
    )


def _approval_resolved(snap: Snapshot, data: Data) -> None:
    entry = _find(snap.get("approvals", []), "approvalId", data["approvalId"])
    if entry is not None:
        entry["status"] = data["status"]
        entry["by"] = data.get("by")


def _run_cancelled(snap: Snapshot, data: Data) -> None:
    for entry in snap.get("approvals", []):
        if entry["status"] == "pending":
            entry["status"] = "cancelled"


def _usage(snap: Snapshot, data: Data) -> None:
    snap["usage"] = calls.totals_of(data)  # a stub's too, its zeros put back


def _run_failed(snap: Snapshot, data: Data) -> None:
    details = {k: v for k, v in data.items() if k not in ("errorType", "message")}
    snap["error"] = {"type": data.get("errorType"), "message": data.get("message"), **details}


def _artifact_written(snap: Snapshot, data: Data) -> None:
    # The run's artifacts, latest version each: the links its answer refers to.
    artifacts = snap.setdefault("artifacts", [])
    entry = _find(artifacts, "artifactId", data["artifactId"])
    if entry is None:
        entry = {"artifactId": data["artifactId"]}
        artifacts.append(entry)
    if data["version"] >= entry.get("version", 0):
        keys = ("name", "version", "mediaType", "size", "link")
        entry.update({k: data[k] for k in keys})


def _subagent_started(snap: Snapshot, data: Data) -> None:
    children = snap.setdefault("children", [])
    child = _find(children, "toolCallId", data["toolCallId"])
    if child is None:
        child = {"toolCallId": data["toolCallId"]}
        children.append(child)
    child.update({"runId": data["childRunId"], "agent": data["agent"], "task": data["task"]})
    child["status"] = "running"


def _subagent_completed(snap: Snapshot, data: Data) -> None:
    children = snap.setdefault("children", [])
    child = _find(children, "toolCallId", data["toolCallId"])
    if child is None:  # refused: no child run was started
        child = {"toolCallId": data["toolCallId"], "task": None}
        children.append(child)
    child.update(
        {"runId": data.get("childRunId"), "agent": data["agent"], "status": data["status"]}
    )


# How each event type changes the snapshot beyond its status; the others change only that.
_FOLDS: dict[str, Callable[[Snapshot, Data], None]] = {
    E.RUN_STARTED: _run_started,
    E.MESSAGE_ITEM_CREATED: _item_created,
    E.MESSAGE_ITEM_DELTA: _item_delta,
    E.MESSAGE_ITEM_COMPLETED: _item_completed,
    E.TOOL_STARTED: _tool_started,
    E.TOOL_COMPLETED: _tool_completed,
    E.TOOL_FAILED: _tool_failed,
    E.APPROVAL_REQUIRED: _approval_required,
    E.APPROVAL_RESOLVED: _approval_resolved,
    E.RUN_CANCELLED: _run_cancelled,
    E.USAGE: _usage,
    E.RUN_FAILED: _run_failed,
    E.ARTIFACT_CREATED: _artifact_written,
    E.ARTIFACT_UPDATED: _artifact_written,
    E.PLAN_UPDATED: fold_plan,
    E.SUBAGENT_STARTED: _subagent_started,
    E.SUBAGENT_COMPLETED: _subagent_completed,
}


def apply_event(snap: Snapshot, seq: int, kind: str, data: Data) -> Snapshot:
    """Fold event `seq` of type `kind` into `snap` (in place) and return it.

    Raises:
        IllegalTransitionError: the event would move the run along a forbidden edge.
    """
    fold = _FOLDS.get(kind)
    if fold is not None:
        fold(snap, data)
    snap["status"] = check_transition(snap["status"], _next_status(snap, kind)).value
    snap["lastEventId"] = seq
    if "plan" in snap and kind != E.MESSAGE_ITEM_DELTA:
        snap["execution"] = execution_view(snap)
    return snap


def output_text(snap: Snapshot) -> str:
    """Return the assistant text so far: every item not superseded, joined by a blank line."""
    return ITEM_SEPARATOR.join(
        i["text"] for i in snap["items"] if i["status"] != "superseded" and i["text"]
    )


def streaming_item_ids(snap: Snapshot) -> list[str]:
    """Return the ids of message items that were started but never completed."""
    return [i["itemId"] for i in streaming_items(snap)]


def streaming_items(snap: Snapshot) -> list[dict[str, Any]]:
    """Return the message items that were started but never completed, with their text."""
    return [i for i in snap["items"] if i["status"] == "streaming"]
