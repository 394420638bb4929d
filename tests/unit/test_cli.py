"""The `agentrt` command line: help everywhere, rendering of refusals and resumes, settings."""

from __future__ import annotations

import argparse
import io

import pytest

from server.client.follow import Renderer
from server.client.parser import build_parser
from server.settings import Settings


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:  # argparse offers no public way to walk subcommands
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_all_parsers(sub))
    return found


def test_every_option_and_argument_has_help_text() -> None:
    missing = [
        f"{parser.prog} {action.dest}"
        for parser in _all_parsers(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]
    assert missing == []


def _render(events: list[tuple[str, dict[str, object]]]) -> str:
    out = io.StringIO()
    renderer = Renderer(out)
    for kind, data in events:
        renderer.event({"type": kind, "data": data})
    return out.getvalue()


def test_a_refused_tool_call_does_not_render_as_if_it_ran() -> None:
    text = _render(
        [
            ("tool.started", {"name": "send_email", "args": {"to": "x"}, "refused": True}),
            (
                "tool.failed",
                {"name": "send_email", "errorType": "rejected", "error": "ann rejected this"},
            ),
        ]
    )
    assert "->" not in text and "failed" not in text
    assert "send_email" in text and "was not run" in text and "ann rejected this" in text


def test_a_resume_after_an_approval_does_not_look_like_a_retry() -> None:
    text = _render(
        [
            ("run.started", {"attempt": 1}),
            ("approval.required", {"approvalId": "apr_1", "name": "send_email", "args": {}}),
            ("approval.resolved", {"approvalId": "apr_1", "status": "approved", "by": "ann"}),
            ("run.requeued", {"reason": "approval resolved"}),
            ("run.started", {"attempt": 2}),
        ]
    )
    assert "resumed" in text
    assert "attempt" not in text and "requeued" not in text


def test_a_real_restart_is_shown_as_one() -> None:
    text = _render(
        [
            ("run.started", {"attempt": 1}),
            ("run.requeued", {"reason": "lease expired"}),
            ("run.started", {"attempt": 2}),
        ]
    )
    assert "lease expired" in text and "attempt 2" in text


def test_tool_modules_accept_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRT_TOOL_MODULES", "mytools:send_note, other.tools:ALL")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.tool_modules == ["mytools:send_note", "other.tools:ALL"]
    monkeypatch.setenv("AGENTRT_TOOL_MODULES", '["a:b"]')
    assert Settings(_env_file=None).tool_modules == ["a:b"]  # type: ignore[call-arg]
