"""One agentrt server and one headless Chromium per test module, shared by its tests."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, BrowserContext, Page, expect

from bench.browser import SKIP_ENV, browser_missing, chromium
from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.auth import create_api_key
from server.db.pool import Pool
from server.settings import ModelPrice, Settings
from server.usage.registry import ModelRegistry
from tests.support.live import serve
from tools.plan.tool import update_plan
from tools.spec import agent_tool

# The screenshots of docs/console.md; a run writes them there only when asked, so that a test
# run leaves the work tree clean (`AGENTRT_CONSOLE_SCREENSHOTS=docs` or `make screenshots`).
DOCS_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
SHOTS = (
    DOCS_SHOTS
    if os.environ.get("AGENTRT_CONSOLE_SCREENSHOTS") == "docs"
    else Path(".pytest-tmp").resolve() / "console-screenshots"
)
PRICE = ModelPrice(input_per_mtok=Decimal("2.50"), output_per_mtok=Decimal("10"))
STORY = (
    "Durable runs keep every event in order. A reader who reloads the page gets the snapshot "
    "first and then only the events after it, so nothing is shown twice and nothing is lost. "
    "This answer streams slowly on purpose, a few characters at a time, so that a test can "
    "reload the page while it is still being written and compare the result at the end."
)


@agent_tool(risk="high", permissions=set(), idempotent=False, dedupes=True)
async def send_email(to: str, subject: str) -> str:
    """Send an email to someone.

    Args:
        to: The recipient's address.
        subject: The subject line.
    """
    return f"sent to {to}"


def plan_call(call_id: str, **args: object) -> ScriptedToolCall:
    return ScriptedToolCall(id=call_id, name="update_plan", args=args)


SCRIPTS = {
    "story": [ScriptedTurn(text=STORY, chunk_chars=3, delay_s=0.06)],
    "long": [ScriptedTurn(text="x " * 2000, chunk_chars=2, delay_s=0.05)],
    "email": [
        ScriptedTurn(
            text="I will send it.",
            tool_calls=[
                ScriptedToolCall(
                    id="e1", name="send_email", args={"to": "ops@example.com", "subject": "hi"}
                )
            ],
        ),
        ScriptedTurn(text="Sent."),
    ],
    "broken": [ScriptedTurn(error="the provider answered 500 three times")],
    "priced": [
        ScriptedTurn(
            text="Here is the plan.",
            tool_calls=[
                plan_call(
                    "p1",
                    action="create",
                    steps=[
                        {"id": "1", "title": "Read the ticket", "status": "done"},
                        {"id": "2", "title": "Draft the answer", "status": "running"},
                        {"id": "3", "title": "Send it"},
                    ],
                )
            ],
            usage={"input_tokens": 1200, "output_tokens": 345, "total_tokens": 1545},
        ),
        ScriptedTurn(
            text="A priced answer.",
            usage={"input_tokens": 1500, "output_tokens": 40, "total_tokens": 1540},
        ),
    ],
}


@dataclass
class Console:
    """The server under test, an API client and the keys of its people."""

    url: str
    client: httpx.AsyncClient
    key: str
    headers: dict[str, str]
    pool: Pool


@pytest.fixture(scope="module")
async def console(settings: Settings, pool: Pool) -> AsyncIterator[Console]:
    custom = settings.model_copy(
        update={
            "auth_enabled": True,
            "model_max_attempts": 1,
            "model_prices": {"scripted:priced": PRICE},
        }
    )
    app = create_app(custom, models=ModelRegistry(custom, SCRIPTS), tools=[send_email, update_plan])
    key = await create_api_key(pool, "acme", "alice", ["admin"])
    headers = {"Authorization": f"Bearer {key}"}
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        planner = {
            "name": "planner",
            "instructions": "Plan, then answer.",
            "plan": {"enabled": True},
        }
        created = await client.post("/api/agents", json=planner, headers=headers)
        assert created.status_code == 201, created.text
        yield Console(url, client, key, headers, pool)


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    missing = browser_missing()
    if missing is not None:
        if os.environ.get(SKIP_ENV) == "1":
            pytest.skip(f"{SKIP_ENV}=1: {missing}")
        pytest.fail(missing)
    async with chromium() as b:
        yield b


@pytest.fixture
async def context(browser: Browser) -> AsyncIterator[BrowserContext]:
    ctx = await browser.new_context(viewport={"width": 1400, "height": 900})
    ctx.set_default_timeout(30_000)
    expect.set_options(timeout=30_000)
    yield ctx
    await ctx.close()


@pytest.fixture
async def page(context: BrowserContext, console: Console) -> Page:
    """A page already signed in (the key in sessionStorage, as the sign-in form leaves it)."""
    await context.add_init_script(f"sessionStorage.setItem('agentrt.apiKey', {console.key!r});")
    return await context.new_page()


async def start_run(
    console: Console, script: str, content: str = "hello", agent: str = "default"
) -> str:
    """Post a message that runs `scripted:<script>` with profile `agent`; return the run id."""
    c = console.client
    conv = (await c.post("/api/conversations", json={}, headers=console.headers)).json()
    response = await c.post(
        f"/api/conversations/{conv['conversationId']}/messages",
        json={"content": content, "model": f"scripted:{script}", "agent": agent},
        headers=console.headers,
    )
    assert response.status_code == 202, response.text
    run_id: str = response.json()["runId"]
    return run_id


async def shot(page: Page, name: str) -> None:
    """Save a screenshot of the page for docs/console.md."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=False)
