"""The run state machine accepts the documented edges and rejects every other one."""

from __future__ import annotations

import itertools

import pytest

from server.domain import TERMINAL, TRANSITIONS, RunStatus, can_pause, check_transition
from server.errors import IllegalTransitionError


@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("queued", "running"),
        ("running", "waiting_tool"),
        ("waiting_tool", "running"),
        ("running", "waiting_user"),
        ("waiting_user", "queued"),
        ("running", "completed"),
        ("queued", "cancelled"),
        ("running", "queued"),
    ],
)
def test_documented_transitions_are_allowed(current: str, target: str) -> None:
    assert check_transition(current, target) == RunStatus(target)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("completed", "running"),
        ("failed", "queued"),
        ("cancelled", "completed"),
        ("queued", "completed"),
        ("queued", "waiting_tool"),
        ("waiting_user", "completed"),
    ],
)
def test_illegal_transitions_raise(current: str, target: str) -> None:
    with pytest.raises(IllegalTransitionError, match=f"from {current} to {target}"):
        check_transition(current, target)


def test_terminal_states_have_no_way_out() -> None:
    for status, target in itertools.product(TERMINAL, RunStatus):
        if status != target:
            with pytest.raises(IllegalTransitionError):
                check_transition(status, target)


def test_every_status_is_in_the_table() -> None:
    assert set(TRANSITIONS) == set(RunStatus)


def test_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError):
        check_transition("running", "sleeping")


@pytest.mark.parametrize("current", ["queued", "running", "waiting_tool", "waiting_user"])
def test_every_unfinished_run_can_be_paused(current: str) -> None:
    assert can_pause(current)
    assert check_transition(current, "paused") == RunStatus.PAUSED


@pytest.mark.parametrize("current", ["paused", "completed", "failed", "cancelled"])
def test_a_paused_or_finished_run_cannot_be_paused(current: str) -> None:
    assert not can_pause(current)


@pytest.mark.parametrize("target", ["queued", "waiting_user", "cancelled"])
def test_a_paused_run_leaves_by_resume_or_cancel(target: str) -> None:
    assert check_transition("paused", target) == RunStatus(target)


@pytest.mark.parametrize("target", ["running", "waiting_tool", "completed", "failed"])
def test_no_worker_moves_a_paused_run(target: str) -> None:
    with pytest.raises(IllegalTransitionError):
        check_transition("paused", target)
