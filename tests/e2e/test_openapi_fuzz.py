"""Schemathesis over `/openapi.json`: no server error; statuses, bodies, media types and
headers as documented; 405 with `Allow` for a method a path does not serve.

Before fuzzing, the test stores one of each resource (a finished run, a run waiting for an
approval, an artifact, an agent, a skill, a memory, a knowledge base with a document, a
LangGraph assistant, thread and cron); the fuzzer takes their ids for path parameters most of
the time, so operations on existing resources are fuzzed beyond their 404.

The suite runs a small budget; `make fuzz` runs the same test with a large one
(`FUZZ_EXAMPLES`, `FUZZ_MAX_TIME`, `FUZZ_SEED`, `FUZZ_CHECKS`, `FUZZ_PHASES` tune it).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app, default_tools
from server.auth import create_api_key
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.artifact_tools import render_chart
from tests.support.live import serve
from tests.support.tools import launch_rocket

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "5"))
MAX_TIME = int(os.environ.get("FUZZ_MAX_TIME", "40"))
SEED = os.environ.get("FUZZ_SEED")
# The stateful phase chains the operations by the links schemathesis infers from the schema.
PHASES = os.environ.get("FUZZ_PHASES", "examples,coverage,fuzzing,stateful")
# Every check schemathesis has but `positive_data_acceptance` (`FUZZ_CHECKS=all` runs it too;
# docs/decisions/2029): some rules no schema can say are checked (a cron expression that
# parses, say).
CHECKS = os.environ.get(
    "FUZZ_CHECKS",
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_headers_conformance,response_schema_conformance,missing_required_header,"
    "unsupported_method,allow_header_conformance,use_after_free,ensure_resource_availability,"
    "ignored_auth,negative_data_rejection",
)

pytestmark = pytest.mark.timeout(2 * MAX_TIME + 480)


@pytest.fixture(scope="module")
async def base_url(settings: Settings) -> AsyncIterator[str]:
    secured = settings.model_copy(update={"auth_enabled": True, "max_message_chars": 2000})
    models = ModelRegistry(
        secured,
        {
            "hi": [ScriptedTurn(text="hello")],
            "rocket": [
                ScriptedTurn(
                    tool_calls=[ScriptedToolCall(name="launch_rocket", args={"target": "moon"})]
                ),
                ScriptedTurn(text="launched"),
            ],
            "chart": [
                ScriptedTurn(tool_calls=[ScriptedToolCall(name="render_chart", args={"size": 64})]),
                ScriptedTurn(text="drawn"),
            ],
        },
    )
    tools = [*default_tools(secured), launch_rocket, render_chart]
    async with serve(create_app(secured, models=models, tools=tools)) as url:
        yield url


async def _until(check: Callable[[], Awaitable[Any]], what: str) -> Any:
    """Return `check()`'s first truthy answer, polled until a generous deadline."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if found := await check():
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"never saw {what}")


def _span_ids(span: dict[str, Any]) -> list[str]:
    return [span["spanId"], *(i for child in span.get("children", []) for i in _span_ids(child))]


async def _seed(c: httpx.AsyncClient) -> dict[str, list[str]]:
    """Store one of each resource; return the ids for each path parameter."""

    async def ok(response: Awaitable[httpx.Response]) -> Any:
        answer = await response
        assert answer.status_code < 300, answer.text
        return answer.json()

    async def run_of(model: str) -> tuple[str, str]:
        """Post a message in a new conversation; return the conversation and the run."""
        conv = (await ok(c.post("/api/conversations", json={})))["conversationId"]
        posted = c.post(
            f"/api/conversations/{conv}/messages", json={"content": "go", "model": model}
        )
        return conv, str((await ok(posted))["runId"])

    async def completed(run: str) -> bool:
        return bool((await ok(c.get(f"/api/runs/{run}")))["status"] == "completed")

    (conv, done), (_, waiting), (_, drawn) = [
        await run_of(f"scripted:{m}") for m in ("hi", "rocket", "chart")
    ]
    await _until(lambda: completed(done), "the first run complete")
    await _until(lambda: completed(drawn), "the chart run complete")

    async def pending() -> list[str]:
        rows = (await ok(c.get(f"/api/runs/{waiting}/approvals")))["approvals"]
        return [a["approvalId"] for a in rows if a["status"] == "pending"]

    approvals = await _until(pending, "the approval")
    trace = await _until(lambda: ok(c.get(f"/api/runs/{done}/trace")), "the trace")
    artifacts = (await ok(c.get(f"/api/runs/{drawn}/artifacts")))["artifacts"]
    await ok(c.post("/api/agents", json={"name": "helper", "instructions": "Be brief."}))
    skill_md = "---\nname: house-style\ndescription: Write plainly.\n---\nBe plain.\n"
    await ok(c.post("/api/skills", json={"skillMd": skill_md}))
    memory = await ok(c.post("/api/memories", json={"text": "The user likes tea."}))
    kb = await ok(c.post("/api/knowledge-bases", json={"name": "handbook"}))
    document = await ok(
        c.post(
            f"/api/knowledge-bases/{kb['id']}/documents",
            files={"file": ("tea.md", b"# Tea\n\nSteep for three minutes.", "text/markdown")},
        )
    )
    assistant = await ok(c.post("/assistants", json={"graph_id": "agent"}))
    thread = await ok(c.post("/threads", json={}))
    ask = {"messages": [{"role": "user", "content": "hi"}]}
    thread_run = await ok(
        c.post(f"/threads/{thread['thread_id']}/runs", json={"assistant_id": "agent", "input": ask})
    )
    await ok(c.get(f"/threads/{thread['thread_id']}/runs/{thread_run['run_id']}/join"))
    state = await ok(c.get(f"/threads/{thread['thread_id']}/state"))
    cron = await ok(
        c.post(
            "/runs/crons",
            json={"assistant_id": assistant["assistant_id"], "schedule": "0 0 1 1 *"},
        )
    )
    return {
        "conversation_id": [conv],
        # Not the run waiting for its approval: its streams stay open until it ends.
        "run_id": [done, drawn, thread_run["run_id"]],
        "approval_id": approvals,
        "span_id": _span_ids(trace["root"]),
        "kind": ["input", "output"],
        "name": ["helper", "house-style"],
        "memory_id": [memory["id"]],
        "artifact_id": [a["id"] for a in artifacts],
        "kb": [kb["id"], "handbook"],
        "document_id": [document["id"]],
        "assistant_id": [assistant["assistant_id"]],
        "thread_id": [thread["thread_id"]],
        "checkpoint_id": [state["checkpoint"]["checkpoint_id"]],
        "cron_id": [cron["cron_id"]],
    }


# Ids that request bodies carry too (a LangGraph run's or cron's assistant, a thread).
BODY_IDS = ("assistant_id", "thread_id")


def _config(ids: dict[str, list[str]], folder: Path) -> Path:
    """Write a schemathesis config that draws each path parameter from `ids` most of the time."""
    lines = []
    for name, values in ids.items():
        lines += [f"[dictionaries.{name}]", f"values = {json.dumps(values)}", ""]
    lines.append("[parameters]")
    bound = [f"path.{name}" for name in ids] + [f"body.{name}" for name in BODY_IDS if name in ids]
    for key in bound:
        name = key.partition(".")[2]
        lines.append(f'"{key}" = {{ dictionary = "{name}", probability = 0.8 }}')
    folder.mkdir(exist_ok=True)
    path = folder / "schemathesis.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


# Erasing a user revokes their keys: fuzzed with the others, it erases the fuzzer itself once
# it guesses the user id (which responses show), and every operation after answers 401. It is
# fuzzed on its own, last.
SELF_ERASING = "DELETE /api/users/{user_id}/data"
# Requests that wait for a run to end, their heartbeats keeping the connection open: with a
# stored assistant, a fuzzed run that starts late (`after_seconds`) keeps them open past any
# budget. They are fuzzed without the stored ids.
BLOCKING = (
    "POST /runs/wait",
    "POST /runs/stream",
    "POST /threads/{thread_id}/runs/wait",
    "POST /threads/{thread_id}/runs/stream",
    "GET /threads/{thread_id}/runs/{run_id}/join",
    "GET /threads/{thread_id}/runs/{run_id}/stream",
)
# A thread's join stream follows the thread until the client leaves: on any thread that
# exists, a request never ends. Other operations create threads of any id (`if_not_exists`),
# so it is fuzzed first, on random ids, before they run.
ENDLESS = "GET /threads/{thread_id}/stream"


async def _schemathesis(base_url: str, key: str, config: Path, report_dir: Path, *args: str) -> str:
    """Run the schemathesis CLI with `args`; return its output, failing the test on findings."""
    common = [
        f"{base_url}/openapi.json",
        f"--header=Authorization: Bearer {key}",
        f"--checks={CHECKS}",
        "--workers=1",
        "--request-timeout=20",
        "--suppress-health-check=all",
        "--generation-allow-x00=true",
        f"--report-dir={report_dir}",
        *([f"--seed={SEED}"] if SEED else []),
    ]
    # The CLI runs in its own process so this event loop keeps serving its requests.
    cli = Path(sys.executable).with_name("schemathesis")
    proc = await asyncio.create_subprocess_exec(
        str(cli),
        f"--config-file={config}",
        "run",
        *common,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=report_dir,  # its crash cache goes there, not into the repository
        env={**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_TELEMETRY": "false"},
    )
    async with asyncio.timeout(MAX_TIME + 180):
        output, _ = await proc.communicate()
    text = output.decode(errors="replace")
    print(text)
    assert proc.returncode == 0, text[-8000:]
    return text


async def test_the_api_conforms_to_its_openapi_schema_under_fuzzing(
    base_url: str, pool: Pool, tmp_path: Path
) -> None:
    key = await create_api_key(pool, "fuzz", "fuzzer", ["admin"])
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as c:
        ids = await _seed(c)
    assert all(ids.values()), ids
    config = _config(ids, tmp_path)

    async def fuzz(*args: str) -> None:
        await _schemathesis(base_url, key, config, tmp_path, f"--max-examples={EXAMPLES}", *args)
        # Every operation was fuzzed with a working key: none locked the fuzzer out.
        async with httpx.AsyncClient(base_url=base_url, headers=headers) as c:
            me = await c.get("/api/usage")
        assert me.status_code == 200, me.text

    # The thread's join stream first; deletes last, so that the other operations meet the
    # stored resources; the fuzzer's own erasure after everything.
    phases = f"--phases={PHASES}"
    plain = _config({}, tmp_path / "plain")
    await _schemathesis(
        base_url,
        key,
        plain,
        tmp_path,
        f"--max-examples={EXAMPLES}",
        phases,
        f"--include-name={ENDLESS}",
    )
    blocking = [f"--exclude-name={name}" for name in (*BLOCKING, ENDLESS)]
    await fuzz(phases, f"--max-time={MAX_TIME}", "--exclude-method=DELETE", *blocking)
    only = [f"--include-name={name}" for name in BLOCKING]
    await _schemathesis(base_url, key, plain, tmp_path, f"--max-examples={EXAMPLES}", phases, *only)
    await fuzz(
        phases,
        f"--max-time={max(MAX_TIME // 2, 10)}",
        "--include-method=DELETE",
        f"--exclude-name={SELF_ERASING}",
    )
    await _schemathesis(
        base_url,
        key,
        config,
        tmp_path,
        f"--max-examples={EXAMPLES}",
        phases,
        f"--include-name={SELF_ERASING}",
    )
