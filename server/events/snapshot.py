"""The run snapshot: a pure projection of the event log.

`apply_event` folds one event into a snapshot. The event writer applies it to every event in
the same transaction that stores the event, so the stored snapshot and the log always agree.
"""

from __future__ import annotations

from typing import Any

from server.domain import RunStatus, check_transition

Snapshot = dict[str, Any]

_STATUS_BY_EVENT = {
    "run.created": RunStatus.QUEUED,
    "run.started": RunStatus.RUNNING,
    "run.requeued": RunStatus.QUEUED,
    "approval.required": RunStatus.WAITING_USER,
    "run.completed": RunStatus.COMPLETED,
    "run.failed": RunStatus.FAILED,
    "run.cancelled": RunStatus.CANCELLED,
    "run.paused": RunStatus.PAUSED,
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
    return copy


def _find(rows: list[Any], key: str, value: str) -> Any:
    for row in reversed(rows):  # the row we want is nearly always the newest
        if row[key] == value:
            return row
    return None


_TOOL_EVENTS = frozenset({"tool.started", "tool.completed", "tool.failed"})
_MOVES_STATUS = frozenset(_STATUS_BY_EVENT) | _TOOL_EVENTS | {"approval.resolved", "run.resumed"}


def _next_status(snap: Snapshot, kind: str) -> RunStatus:
    current = RunStatus(snap["status"])
    if kind in _STATUS_BY_EVENT:
        return _STATUS_BY_EVENT[kind]
    if kind == "run.resumed":
        # Back where it waits: for a reviewer while approvals are pending, else for a worker.
        pending = any(a["status"] == "pending" for a in snap.get("approvals", []))
        return RunStatus.WAITING_USER if pending else RunStatus.QUEUED
    if kind == "approval.resolved":
        waiting = any(a["status"] == "pending" for a in snap.get("approvals", []))
        return RunStatus.QUEUED if current == RunStatus.WAITING_USER and not waiting else current
    if kind == "tool.started" and current == RunStatus.RUNNING:
        return RunStatus.WAITING_TOOL
    if kind in ("tool.completed", "tool.failed") and current == RunStatus.WAITING_TOOL:
        tools_running = any(t["status"] == "running" for t in snap["toolCalls"])
        return RunStatus.WAITING_TOOL if tools_running else RunStatus.RUNNING
    return current


def apply_event(snap: Snapshot, seq: int, kind: str, data: dict[str, Any]) -> Snapshot:
    """Fold event `seq` of type `kind` into `snap` (in place) and return it.

    Raises:
        IllegalTransitionError: the event would move the run along a forbidden edge.
    """
    items: list[dict[str, Any]] = snap["items"]
    if kind == "run.started":
        snap["attempt"] = data.get("attempt", snap["attempt"])
    elif kind == "message.item.created":
        items.append(
            {
                "itemId": data["itemId"],
                "role": data.get("role", "assistant"),
                "text": "",
                "status": "streaming",
            }
        )
    elif kind == "message.item.delta":
        item = _find(items, "itemId", data["itemId"])
        if item is not None:
            item["text"] += data["delta"]
    elif kind == "message.item.completed":
        item = _find(items, "itemId", data["itemId"])
        if item is not None:
            item["text"] = data.get("text", item["text"])
            item["status"] = data.get("status", "completed")
    elif kind == "tool.started":
        # A replay after a crash starts the same call again: one row per call id.
        call = _find(snap["toolCalls"], "toolCallId", data["toolCallId"])
        if call is None:
            call = {"toolCallId": data["toolCallId"]}
            snap["toolCalls"].append(call)
        call.update({"name": data["name"], "args": data.get("args", {}), "status": "running"})
        call.pop("error", None)
    elif kind in ("tool.completed", "tool.failed"):
        call = _find(snap["toolCalls"], "toolCallId", data["toolCallId"])
        if call is not None:
            call["status"] = "completed" if kind == "tool.completed" else "failed"
            call["durationMs"] = data.get("durationMs")
            if kind == "tool.failed":
                call["error"] = data.get("error")
                call["errorType"] = data.get("errorType")
    elif kind == "approval.required":
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
    elif kind == "approval.resolved":
        entry = _find(snap.get("approvals", []), "approvalId", data["approvalId"])
        if entry is not None:
            entry["status"] = data["status"]
            entry["by"] = data.get("by")
    elif kind == "run.cancelled":
        for entry in snap.get("approvals", []):
            if entry["status"] == "pending":
                entry["status"] = "cancelled"
    elif kind == "usage":
        snap["usage"] = data.get("totals", {})
    elif kind == "run.failed":
        details = {k: v for k, v in data.items() if k not in ("errorType", "message")}
        snap["error"] = {"type": data.get("errorType"), "message": data.get("message"), **details}
    snap["status"] = check_transition(snap["status"], _next_status(snap, kind)).value
    snap["lastEventId"] = seq
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
