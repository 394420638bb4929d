"""Across a server restart: an approval decided later resumes the run exactly where it
stopped, and a tool call replayed after a crash does not repeat its side effect."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.client.commands import cmd_approvals
from server.client.follow import ClientConfig
from server.client.parser import build_parser
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import read_sse, serve, wait_for_event, wait_for_status
from tools.spec import CallContext, ToolSpec, agent_tool


@dataclass
class World:
    """The outside systems the tools act on; they outlive the apps, as real ones would."""

    counter: int = 0
    charges: dict[str, int] = field(default_factory=dict)  # idempotency key -> amount
    charge_keys: list[str] = field(default_factory=list)
    transfers: int = 0
    charged: asyncio.Event = field(default_factory=asyncio.Event)
    transferred: asyncio.Event = field(default_factory=asyncio.Event)
    counted: asyncio.Event = field(default_factory=asyncio.Event)
    emails: int = 0

    def tools(self) -> list[ToolSpec]:
        world = self

        @agent_tool(idempotent=False)
        async def count() -> str:
            """Add one to the counter."""
            world.counter += 1
            world.counted.set()
            return f"counter is {world.counter}"

        @agent_tool(idempotent=False, dedupes=True)
        async def charge(amount: int, call: CallContext) -> str:
            """Charge the card; the provider ignores a repeated idempotency key.

            Args:
                amount: In cents.
            """
            world.charge_keys.append(call.idempotency_key)
            world.charges.setdefault(call.idempotency_key, amount)
            if len(world.charge_keys) == 1:
                world.charged.set()
                await asyncio.Event().wait()  # the first attempt dies here, after its effect
            return f"charged {amount}"

        @agent_tool(idempotent=False)
        async def transfer(amount: int) -> str:
            """Wire money; the bank cannot recognise a repeated request.

            Args:
                amount: In cents.
            """
            world.transfers += 1
            if world.transfers == 1:
                world.transferred.set()
                await asyncio.Event().wait()
            return f"wired {amount}"

        @agent_tool(risk="high")
        async def send_email(to: str) -> str:
            """Send an email.

            Args:
                to: The recipient.
            """
            world.emails += 1
            return f"sent to {to}"

        return [count, charge, transfer, send_email]


SCRIPTS = {
    "crash": [
        ScriptedTurn(
            tool_calls=[
                ScriptedToolCall(id="k1", name="count"),
                ScriptedToolCall(id="k2", name="charge", args={"amount": 500}),
                ScriptedToolCall(id="k3", name="transfer", args={"amount": 700}),
            ]
        ),
        ScriptedTurn(text="All settled."),
    ],
    "email": [
        ScriptedTurn(
            text="I will send it.",
            tool_calls=[ScriptedToolCall(id="m1", name="send_email", args={"to": "a@b.c"})],
        ),
        ScriptedTurn(text="Sent."),
    ],
}


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    yield World()


@pytest.fixture(scope="module")
def fast(settings: Settings) -> Settings:
    """Short leases, so a dead worker's run is reclaimed within about a second."""
    return settings.model_copy(update={"lease_seconds": 1.0, "worker_poll_seconds": 0.3})


def app_for(settings: Settings, world: World) -> Any:
    return create_app(settings, models=ModelRegistry(settings, SCRIPTS), tools=world.tools())


async def post_message(base: str, script: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        conv = (await c.post("/api/conversations", json={})).json()
        response = await c.post(
            f"/api/conversations/{conv['conversationId']}/messages",
            json={"content": "go", "model": f"scripted:{script}"},
        )
        return dict(response.json())


async def test_a_crash_after_side_effects_does_not_repeat_them(
    fast: Settings, world: World, pool: Pool
) -> None:
    async with serve(app_for(fast, world)) as base:
        run = await post_message(base, "crash")
        async with asyncio.timeout(30):
            await world.charged.wait()
            await world.transferred.wait()
            await world.counted.wait()
            while True:  # until `count`'s outcome is in the ledger
                async with pool.connection() as conn:
                    cur = await conn.execute(
                        "SELECT status FROM tool_ledger WHERE run_id = %s AND tool_call_id = 'k1'",
                        (run["runId"],),
                    )
                    row = await cur.fetchone()
                if row and row["status"] == "completed":
                    break
                await asyncio.sleep(0.01)
        # The worker dies mid-step: `count` finished and is recorded, `charge` and `transfer`
        # did their effect but never returned. No checkpoint after call_model was written.
    assert world.counter == 1

    async with serve(app_for(fast, world)) as base, httpx.AsyncClient(base_url=base) as c:
        # The reclaimed run replays dispatch_tools: count is replayed from the ledger, charge
        # re-runs with its idempotency key, transfer cannot, so a person is asked.
        await wait_for_status(c, run["runId"], "waiting_user")
        (approval,) = (await c.get(f"/api/runs/{run['runId']}/approvals")).json()["approvals"]
        assert approval["kind"] == "in_doubt" and approval["tool"] == "transfer"
        assert "crashed before recording its outcome" in approval["reason"]
        decided = await c.post(
            f"/api/approvals/{approval['approvalId']}",
            json={"decision": "reject", "reason": "the bank shows the wire went through"},
        )
        assert decided.status_code == 200
        events = await read_sse(c, run["streamUrl"])

    assert events[-1].event == "run.completed"
    assert world.counter == 1
    assert world.transfers == 1
    assert len(set(world.charge_keys)) == 1 and len(world.charge_keys) == 2
    assert sum(world.charges.values()) == 500
    replays = [
        e.data["data"]["toolCallId"]
        for e in events
        if e.event == "tool.completed" and e.data["data"]["replayed"]
    ]
    assert "k1" in replays
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT tool_call_id, status, attempts FROM tool_ledger WHERE run_id = %s"
            " ORDER BY tool_call_id",
            (run["runId"],),
        )
        rows = {r["tool_call_id"]: (r["status"], r["attempts"]) for r in await cur.fetchall()}
    # `charge` ran twice (with one key, above), but its first run left no row: a call that is
    # safe to run again is written with its outcome's event on a first attempt, and that
    # attempt died first. `count`'s row came with its event; `transfer` was claimed first.
    assert rows == {"k1": ("completed", 1), "k2": ("completed", 1), "k3": ("failed", 1)}


async def test_an_approval_decided_after_a_restart_resumes_the_run(
    fast: Settings, world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    async with serve(app_for(fast, world)) as base, httpx.AsyncClient(base_url=base) as c:
        run = await post_message(base, "email")
        await wait_for_event(c, run["streamUrl"], "approval.required")
    assert world.emails == 0

    async with serve(app_for(fast, world)) as base:
        cli = ClientConfig(url=base)
        capsys.readouterr()
        assert await cmd_approvals(cli, build_parser().parse_args(["approvals", "list"])) == 0
        listing = capsys.readouterr().out
        assert "send_email" in listing and run["runId"] in listing
        approval_id = next(w for w in listing.split() if w.startswith("apr_"))
        args = build_parser().parse_args(["approve", approval_id, "--reason", "fine"])
        assert await cmd_approvals(cli, args) == 0
        assert "approved" in capsys.readouterr().out
        async with httpx.AsyncClient(base_url=base) as c:
            events = await read_sse(c, run["streamUrl"])
            finished = await wait_for_status(c, run["runId"], "completed")

    assert world.emails == 1
    assert events[-1].event == "run.completed"
    assert events[-1].data["data"]["output"] == "I will send it.\n\nSent."
    assert finished["attempt"] == 2


async def test_reject_from_the_cli_needs_a_reason(fast: Settings) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["reject", "apr_x"])
    args = build_parser().parse_args(["reject", "apr_x", "--reason", "no"])
    assert (args.command, args.reason) == ("reject", "no")
