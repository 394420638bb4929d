"""The Run as a typed record: its statuses and their sets, transitions, failure reasons."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, Self

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
    CONTEXT_OVERFLOW = "context_overflow"
    DEAD_LETTER = "dead_letter"


S = RunStatus
# The named sets every status test and SQL status filter is built from.
TERMINAL = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED})
IN_PROGRESS = frozenset(RunStatus) - TERMINAL  # holds its conversation: one at a time
ACTIVE = frozenset({S.RUNNING, S.WAITING_TOOL})  # a worker holds its lease
# Counted against the per-user run limit: a paused run keeps its conversation, not its place.
COUNTED = IN_PROGRESS - {S.PAUSED}
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


MAX_SEQ = 2**63 - 1
"""The largest event `seq` there can be (Postgres `bigint`)."""


def parse_seq(text: str) -> int | None:
    """Return the event seq that `text` spells in ASCII digits, or None if it spells none.

    `str.isdigit` alone admits digits such as '²', which `int` refuses; a seq beyond `MAX_SEQ`
    names no event.
    """
    if not (text.isascii() and text.isdigit()):
        return None
    seq = int(text)
    return seq if seq <= MAX_SEQ else None


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


def status_in(statuses: Iterable[RunStatus], column: str = "status") -> str:
    """Render `column IN (...)` for SQL from a set of statuses, in a stable order.

    The statuses are constants in the statement text, not bound parameters, so a prepared
    statement's generic plan can still use the partial indexes on `runs.status`.
    """
    values = ", ".join(f"'{RunStatus(s).value}'" for s in sorted(statuses))
    return f"{column} IN ({values})"


Phase = Literal["queued", "active"]


def in_phase(phase: Phase, table: str = "") -> str:
    """Render the SQL test of a run's phase: `queued` (QUEUED), or `active` (ACTIVE).

    `runs.phase` is generated from the status (migration 0036), and the partial indexes of the
    queue and the leases are built on it, so status flips within a phase stay HOT updates. A
    query that should use those indexes tests the phase, as the planner does not infer it
    from a test of the status.
    """
    return f"{table + '.' if table else ''}phase = '{phase}'"


@dataclass(frozen=True, slots=True)
class Run:
    """A run as stored in the `runs` table, read once from its row."""

    id: str
    conversation_id: str
    tenant_id: str
    user_id: str
    status: RunStatus
    model: str
    options: dict[str, Any]
    input_message_id: str
    output_message_id: str | None
    attempt: int
    error_type: str | None
    error_message: str | None
    error_details: dict[str, Any] | None
    last_event_seq: int
    usage: dict[str, Any]
    cancel_requested: bool
    pause_requested: bool
    paused_at: datetime | None
    lease_owner: str | None
    lease_generation: int
    lease_expires_at: datetime | None
    deadline_at: datetime | None
    recoveries: int
    principal_roles: tuple[str, ...]
    agent_name: str
    agent_version: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    parent_run_id: str | None = None
    depth: int = 0
    # Set when the retention dropped the run's event log (record and snapshot stay).
    events_expired_at: datetime | None = None
    # A delayed run (the LangGraph API's `after_seconds`) is not claimed before this time.
    not_before: datetime | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        """Build the run from a `SELECT *` row of `runs` (other keys are ignored).

        Raises:
            KeyError: the row lacks a column of the record.
        """
        # Columns with a default (added by later migrations) may be absent from older rows.
        values = {f.name: row[f.name] for f in fields(cls) if f.name in row or f.default is MISSING}
        values["status"] = RunStatus(values["status"])
        values["options"] = values["options"] or {}
        values["usage"] = values["usage"] or {}
        values["principal_roles"] = tuple(values["principal_roles"] or ())
        return cls(**values)

    @property
    def agent(self) -> tuple[str, int]:
        """The agent profile the run uses: its name and exact version."""
        return self.agent_name, self.agent_version

    @property
    def is_terminal(self) -> bool:
        """Say whether the run is finished for good."""
        return self.status in TERMINAL
