"""The typed Run and the status sets: one definition, used by every SQL status filter."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from server.domain import (
    ACTIVE,
    COUNTED,
    IN_PROGRESS,
    TERMINAL,
    TRANSITIONS,
    Run,
    RunStatus,
    can_pause,
    status_in,
)

ROOT = Path(__file__).resolve().parents[2]
# The only modules that write the runs table: the records, and the event log's fenced append.
RUNS_WRITERS = {"server/runs/records.py", "server/events/store.py"}
_WRITE = re.compile(r"\b(UPDATE|INSERT\s+INTO|DELETE\s+FROM)\s+runs\b", re.IGNORECASE)
# A status set typed out in SQL: `status IN ('running'`, or a list `'queued', 'running'`.
_STATUS = "|".join(s.value for s in RunStatus)
_LITERAL_SET = re.compile(
    rf"status\s+(NOT\s+)?IN\s*\(\s*'|'({_STATUS})',\s*'({_STATUS})'", re.IGNORECASE
)


def server_sources() -> dict[str, str]:
    return {
        path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted((ROOT / "server").rglob("*.py"))
    }


def test_only_the_records_and_the_event_log_write_the_runs_table() -> None:
    writers = {path for path, text in server_sources().items() if _WRITE.search(text)}
    assert writers <= RUNS_WRITERS


def test_no_sql_status_set_is_typed_out_by_hand() -> None:
    typed = {path for path, text in server_sources().items() if _LITERAL_SET.search(text)}
    assert typed == set()


def test_the_status_sets_follow_the_transition_table() -> None:
    assert {s for s, targets in TRANSITIONS.items() if not targets} == TERMINAL
    assert set(RunStatus) - TERMINAL == IN_PROGRESS
    assert ACTIVE < IN_PROGRESS
    assert IN_PROGRESS - {RunStatus.PAUSED} == COUNTED
    assert {s for s in RunStatus if can_pause(s)} == IN_PROGRESS - {RunStatus.PAUSED}


def test_status_in_renders_the_values_in_a_stable_order() -> None:
    assert status_in(ACTIVE) == "status IN ('running', 'waiting_tool')"
    assert status_in([RunStatus.QUEUED], "o.status") == "o.status IN ('queued')"


def row(**changes: Any) -> dict[str, Any]:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    base: dict[str, Any] = {f.name: None for f in dataclasses.fields(Run)}
    base.update(
        id="run_1",
        conversation_id="conv_1",
        tenant_id="t1",
        user_id="u1",
        status="waiting_tool",
        model="demo",
        options={"maxSteps": 3},
        input_message_id="msg_1",
        attempt=1,
        last_event_seq=4,
        usage={},
        cancel_requested=False,
        pause_requested=False,
        lease_generation=1,
        recoveries=0,
        principal_roles=["reviewer"],
        created_at=now,
        updated_at=now,
    )
    base.update(changes)
    return base


def test_a_run_is_built_from_its_row_with_typed_fields() -> None:
    run = Run.from_row(row(input_content="not a column"))
    assert run.status is RunStatus.WAITING_TOOL
    assert run.principal_roles == ("reviewer",)
    assert run.options == {"maxSteps": 3}
    assert not run.is_terminal
    assert Run.from_row(row(status="failed")).is_terminal


def test_a_row_without_a_column_of_the_record_is_refused() -> None:
    incomplete = row()
    del incomplete["lease_generation"]
    with pytest.raises(KeyError, match="lease_generation"):
        Run.from_row(incomplete)


def test_a_row_with_an_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError, match="archived"):
        Run.from_row(row(status="archived"))


def test_a_run_cannot_be_changed_once_built() -> None:
    run = Run.from_row(row())
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.status = RunStatus.COMPLETED  # type: ignore[misc]
