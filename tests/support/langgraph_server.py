"""Fixtures of the LangGraph API tests: agentrt serving langgraph.json, models on a fake server.

A test module binds them to its own names (`fake = langgraph_server.fake`, ...), so that each
module gets its own server (module scope).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from server.app import create_app
from server.settings import Settings
from tests.support.fake_openai import FakeOpenAI
from tests.support.live import serve

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
async def fake() -> AsyncIterator[FakeOpenAI]:
    """The fake OpenAI server the graphs' chat models call."""
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture(scope="module")
def model_env(fake: FakeOpenAI) -> Iterator[None]:
    """Point the OpenAI client of the graphs at the fake server."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OPENAI_BASE_URL", f"{fake.url}/v1")
        env.setenv("OPENAI_API_KEY", "test-key")
        yield


@pytest.fixture(scope="module")
async def url(settings: Settings, model_env: None) -> AsyncIterator[str]:
    """Base URL of agentrt serving the repository's langgraph.json."""
    app_settings = settings.model_copy(update={"langgraph_config": ROOT / "langgraph.json"})
    async with serve(create_app(app_settings)) as base:
        yield base


@pytest.fixture
def client(url: str) -> LangGraphClient:
    """The official SDK's client for that server."""
    return get_client(url=url)
