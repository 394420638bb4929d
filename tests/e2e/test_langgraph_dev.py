"""The graph langgraph.json exposes runs the server's agent: its settings, profile and tools."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.fake_openai import FakeOpenAI, FakeToolCall, Reply
from tests.support.processes import ROOT

pytestmark = pytest.mark.timeout(180)

# What `langgraph dev` does with langgraph.json: load the graph's file by path, then run it
# without any run context.
LOADER = """
import asyncio, importlib.util, json, sys
path, attr = sys.argv[1].split(":")
spec = importlib.util.spec_from_file_location("langgraph_dev_entry", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
graph = getattr(module, attr)
config = {"configurable": {"thread_id": "t1"}}
result = asyncio.run(graph.ainvoke({"messages": [("user", "what is 6*7?")]}, config))
print(json.dumps([m.text for m in result["messages"]]))
"""


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


async def test_langgraph_dev_runs_the_servers_agent(fake: FakeOpenAI, tmp_path: Path) -> None:
    config = json.loads((ROOT / "langgraph.json").read_text())
    entry = config["graphs"]["agent"]
    assert (ROOT / ".gitignore").read_text().splitlines().count(".langgraph_api/") == 1

    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "helper.yaml").write_text(
        "name: helper\ninstructions: You are the dev helper.\ntools: [calculator]\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRT_")}
    env.update(
        AGENTRT_OPENAI_API_KEY="test-key",
        AGENTRT_OPENAI_BASE_URL=fake.url,
        AGENTRT_DEFAULT_MODEL="openai:gpt-4o-mini",
        AGENTRT_AGENTS_DIR=str(agents),
        AGENTRT_DEV_AGENT="helper",
        AGENTRT_DATA_DIR=str(tmp_path / "data"),
    )
    fake.script(
        "gpt-4o-mini",
        Reply(text="", tool_calls=[FakeToolCall("calculator", {"expression": "6*7"})]),
        Reply(text="It is 42."),
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        LOADER,
        str(ROOT / entry.removeprefix("./")),
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 150)
    assert process.returncode == 0, err.decode()[-3000:]
    texts = json.loads(out.decode().splitlines()[-1])
    assert texts[-1] == "It is 42." and "42" in texts[-2]

    first, second = (s.body for s in fake.served_for("gpt-4o-mini"))
    assert first["messages"][0]["content"].startswith("You are the dev helper.")
    assert [t["function"]["name"] for t in first["tools"]] == ["calculator"]
    assert second["messages"][-1]["role"] == "tool" and "42" in second["messages"][-1]["content"]
