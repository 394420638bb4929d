"""The Run state machine, and the reasons a run can fail for."""

from __future__ import annotations

from enum import StrEnum

from server.errors import IllegalTransitionError


class RunStatus(StrEnum):
    """Where a run is in its life; the last three are terminal."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING_TOOL = "waiting_tool"
    WAITING_USER = "waiting_user"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class FailureReason(StrEnum):
    """Why a run failed: the `errorType` of its `run.failed` event.

    A failure none of these names (a fault nobody foresaw) is reported under its exception
    class name instead.
    """

    STEP_LIMIT = "step_limit"
    BUDGET_EXCEEDED = "budget_exceeded"
    MODEL_CALL_FAILED = "model_call_failed"
    TIMEOUT = "timeout"
    DEAD_LETTER = "dead_letter"


S = RunStatus
TERMINAL = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED})
# Back to QUEUED from an active state is recovery: an expired lease or a drained worker.
# PAUSED is left only by a resume (to QUEUED, or WAITING_USER while approvals are pending)
# or a cancel; a worker never picks up a paused run.
TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    S.QUEUED: frozenset({S.RUNNING, S.PAUSED, S.CANCELLED, S.FAILED}),
    S.RUNNING: frozenset(
        {S.WAITING_TOOL, S.WAITING_USER, S.PAUSED, S.QUEUED, S.COMPLETED, S.FAILED, S.CANCELLED}
    ),
    S.WAITING_TOOL: frozenset(
        {S.RUNNING, S.WAITING_USER, S.PAUSED, S.QUEUED, S.FAILED, S.CANCELLED}
    ),
    S.WAITING_USER: frozenset({S.QUEUED, S.RUNNING, S.PAUSED, S.FAILED, S.CANCELLED}),
    S.PAUSED: frozenset({S.QUEUED, S.WAITING_USER, S.CANCELLED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}


def check_transition(current: RunStatus | str, target: RunStatus | str) -> RunStatus:
    """Return `target` if a run in `current` may move there, else raise."""
    current, target = RunStatus(current), RunStatus(target)
    if current != target and target not in TRANSITIONS[current]:
        raise IllegalTransitionError(current, target)
    return target


def can_pause(status: RunStatus | str) -> bool:
    """Say whether a run in `status` may be paused (it is not finished and not paused yet)."""
    return S.PAUSED in TRANSITIONS[RunStatus(status)]


def is_terminal(status: RunStatus | str) -> bool:
    """Say whether a run in `status` is finished for good."""
    return RunStatus(status) in TERMINAL
