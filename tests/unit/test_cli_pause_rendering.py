"""A person following a run in the terminal sees when it is paused and how to resume it."""

from __future__ import annotations

import io

from server.client.follow import Renderer
from server.client.parser import build_parser


def test_pause_and_resume_are_shown_with_the_command_to_resume() -> None:
    out = io.StringIO()
    renderer = Renderer(out)
    renderer.event({"type": "run.paused", "runId": "run_1", "data": {"from": "running"}})
    renderer.event({"type": "run.resumed", "runId": "run_1", "data": {"by": "alice"}})
    assert out.getvalue() == (
        "[run paused; resume with: agentrt runs resume run_1]\n[run resumed by alice]\n"
    )


def test_runs_pause_and_resume_take_a_run_id() -> None:
    for action in ("pause", "resume"):
        args = build_parser().parse_args(["runs", action, "run_1"])
        assert (args.command, args.action, args.run_id) == ("runs", action, "run_1")
