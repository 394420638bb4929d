"""Skills and plans across real processes: the API in this process, runs in `agentrt worker`.

A repository skill is listed, loaded by the scripted model, narrows the tools and is
recorded with its version; a version uploaded while a run is down (kill -9) does not change
what the run resumes with; another tenant never sees an uploaded skill. A plan survives a
kill -9 mid-step, the snapshot's plan and execution view match the event log at every point,
and a cancelled run shows its remaining steps skipped.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.auth import create_api_key
from server.db.pool import Pool
from server.events.snapshot import apply_event, empty_snapshot
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import SseEvent, read_sse, serve
from tests.support.processes import WorkerProcess, worker_env, workers, write_scripts

# Deadlines are generous: the suite must pass on a loaded 2-core machine beside another suite.
pytestmark = pytest.mark.timeout(400)
SLOW_S = 150
COUNTER = "COUNTER"

HOUSE_STYLE = """---
name: house-style
description: Write in the house style of tenant A.
version: "{label}"
allowed-tools: bump_counter current_time
---
{body}
"""
STEPS = [{"title": "Count once"}, {"title": "Count again"}, {"title": "Report"}]


def tool(tool_name: str, **args: Any) -> ScriptedToolCall:
    return ScriptedToolCall(name=tool_name, args=args)


def mark(step: str, status: str) -> ScriptedToolCall:
    return tool("update_plan", action="mark", step_id=step, status=status)


SCRIPTS: dict[str, list[ScriptedTurn]] = {
    "repo_skill": [
        ScriptedTurn(tool_calls=[tool("load_skill", name="meeting-notes")]),
        ScriptedTurn(tool_calls=[tool("calculator", expression="6*7"), tool("current_time")]),
        ScriptedTurn(text="Minutes written."),
    ],
    "pinned": [
        ScriptedTurn(tool_calls=[tool("load_skill", name="house-style")]),
        ScriptedTurn(tool_calls=[tool("bump_counter", path=COUNTER, hold_s=3.0)]),
        ScriptedTurn(tool_calls=[tool("load_skill", name="house-style")]),
        ScriptedTurn(text="Styled."),
    ],
    "other_tenant": [
        ScriptedTurn(tool_calls=[tool("load_skill", name="house-style")]),
        ScriptedTurn(text="No such skill."),
    ],
    "plan": [
        ScriptedTurn(tool_calls=[tool("update_plan", action="create", steps=STEPS)]),
        ScriptedTurn(tool_calls=[mark("1", "running")]),
        ScriptedTurn(tool_calls=[tool("bump_counter", path=COUNTER, hold_s=3.0)]),
        ScriptedTurn(tool_calls=[mark("1", "done"), mark("2", "running")]),
        ScriptedTurn(tool_calls=[tool("current_time")]),
        ScriptedTurn(tool_calls=[mark("2", "done"), mark("3", "done")]),
        ScriptedTurn(text="All steps done."),
    ],
    "plan_cancel": [
        ScriptedTurn(tool_calls=[tool("update_plan", action="create", steps=STEPS)]),
        ScriptedTurn(tool_calls=[mark("1", "running")]),
        ScriptedTurn(tool_calls=[tool("bump_counter", path=COUNTER, hold_s=60.0)]),
        ScriptedTurn(text="never"),
    ],
}
WORKER_SETTINGS = {
    "lease_seconds": 2.0,
    "worker_poll_seconds": 0.5,
    "drain_grace_s": 5.0,
    "tool_modules": ["tests.support.tools:bump_counter"],
}


@pytest.fixture(scope="module")
def scripts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("skills")
    counter = str(folder / "counter")
    scripts = {
        name: [
            turn.model_copy(
                update={
                    "tool_calls": [
                        c.model_copy(update={"args": {**c.args, "path": counter}})
                        if c.args.get("path") == COUNTER
                        else c
                        for c in turn.tool_calls
                    ]
                }
            )
            for turn in turns
        ]
        for name, turns in SCRIPTS.items()
    }
    return write_scripts(folder / "scripts.json", scripts)


@pytest.fixture(scope="module")
def env(database_url: str, scripts_file: Path) -> dict[str, str]:
    return worker_env(database_url, scripted_models_file=str(scripts_file), **WORKER_SETTINGS)


@pytest.fixture(scope="module")
async def base_url(settings: Settings, scripts_file: Path) -> AsyncIterator[str]:
    api = settings.model_copy(
        update={
            "run_workers": False,
            "auth_enabled": True,
            "scripted_models_file": scripts_file,
            **WORKER_SETTINGS,
        }
    )
    async with serve(create_app(api, models=ModelRegistry(api))) as url:
        yield url


@pytest.fixture(scope="module")
async def keys(pool: Pool, base_url: str) -> dict[str, str]:
    return {
        "a": await create_api_key(pool, "tenant-a", "alice", ["admin"]),
        "b": await create_api_key(pool, "tenant-b", "bob", ["admin"]),
    }


@pytest.fixture(scope="module")
async def a(base_url: str, keys: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {keys['a']}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client:
        await make_agent(client)
        yield client


@pytest.fixture(scope="module")
async def b(base_url: str, keys: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {keys['b']}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client:
        await make_agent(client)
        yield client


async def make_agent(client: httpx.AsyncClient) -> None:
    body = {"name": "skilled", "skills": ["*"], "plan": {"enabled": True}}
    response = await client.post("/api/agents", json=body)
    assert response.status_code == 201, response.text


async def post(client: httpx.AsyncClient, model: str) -> str:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    response = await client.post(
        f"/api/conversations/{conv}/messages",
        json={"content": "go", "model": f"scripted:{model}", "agent": "skilled"},
    )
    assert response.status_code == 202, response.text
    return str(response.json()["runId"])


async def wait_until(client: httpx.AsyncClient, run_id: str, predicate: Any) -> dict[str, Any]:
    async with asyncio.timeout(SLOW_S):
        while True:
            snap = (await client.get(f"/api/runs/{run_id}/snapshot")).json()
            if predicate(snap):
                return dict(snap)
            await asyncio.sleep(0.05)


def tool_running(name: str) -> Any:
    return lambda s: any(t["name"] == name and t["status"] == "running" for t in s["toolCalls"])


def data(events: list[SseEvent], kind: str) -> list[dict[str, Any]]:
    return [e.data["data"] for e in events if e.event == kind]


async def upload(client: httpx.AsyncClient, label: str, body: str) -> dict[str, Any]:
    text = HOUSE_STYLE.format(label=label, body=body)
    response = await client.post(
        "/api/skills", json={"skillMd": text, "resources": {"tone.md": "Plain words."}}
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


async def test_a_repository_skill_is_listed_loaded_narrows_tools_and_is_recorded(
    a: httpx.AsyncClient, env: dict[str, str]
) -> None:
    listed = {s["name"]: s for s in (await a.get("/api/skills")).json()["skills"]}
    assert {"research-brief", "data-cleaning-checklist", "meeting-notes"} <= set(listed)
    notes = listed["meeting-notes"]
    assert notes["owner"] == "repository" and notes["allowedTools"] == ["current_time"]
    async with workers(env, 1):
        run_id = await post(a, "repo_skill")
        events = await read_sse(a, f"/api/runs/{run_id}/events")
    assert events[-1].event == "run.completed", events[-1]
    (loaded,) = data(events, "skill.loaded")
    assert (loaded["name"], loaded["version"], loaded["hash"]) == (
        "meeting-notes",
        notes["version"],
        notes["hash"],
    )
    failed = {d["name"]: d for d in data(events, "tool.failed")}
    assert failed["calculator"]["errorType"] == "forbidden"
    assert "current_time" not in failed
    built = data(events, "context.built")
    assert "calculator" in built[0]["tools"]
    assert "calculator" not in built[1]["tools"] and "current_time" in built[1]["tools"]
    sections = {s["name"]: s for s in built[1]["sections"]}
    assert "meeting-notes" in str(sections["loaded_skills"])
    usage = (await a.get("/api/skills/meeting-notes/usage")).json()
    assert [(v["version"], v["hash"], v["runs"]) for v in usage["versions"]] == [
        (notes["version"], notes["hash"], 1)
    ]
    assert usage["recentRuns"][0]["runId"] == run_id


async def test_a_version_uploaded_while_a_run_is_down_does_not_change_it(
    a: httpx.AsyncClient, env: dict[str, str]
) -> None:
    first = await upload(a, "1", "Write short sentences.")
    assert first["version"] == 1 and first["owner"] == "tenant"
    killed = WorkerProcess(env)
    await killed.start()
    try:
        run_id = await post(a, "pinned")
        await wait_until(a, run_id, tool_running("bump_counter"))
        killed.signal(signal.SIGKILL)
        await killed.wait()
    finally:
        await killed.close()
    second = await upload(a, "2", "Write long sentences.")
    assert second["version"] == 2 and second["hash"] != first["hash"]
    async with workers(env, 1):
        events = await read_sse(a, f"/api/runs/{run_id}/events")
    assert events[-1].event == "run.completed", events[-1]
    assert "run.requeued" in [e.event for e in events]
    loads = data(events, "skill.loaded")
    assert {(d["version"], d["hash"]) for d in loads} == {(1, first["hash"])}
    last = data(events, "context.built")[-1]
    (kept,) = next(s for s in last["sections"] if s["name"] == "loaded_skills")["itemDetails"]
    assert kept["hash"] == first["hash"]
    outputs = [d["output"] for d in data(events, "tool.completed") if d["name"] == "load_skill"]
    assert all(first["hash"] in o for o in outputs) and len(outputs) >= 2
    usage = (await a.get("/api/skills/house-style/usage")).json()
    assert [(v["version"], v["runs"]) for v in usage["versions"]] == [(1, 1)]
    versions = (await a.get("/api/skills/house-style/versions")).json()["versions"]
    assert [v["version"] for v in versions] == [2, 1]


async def test_another_tenant_never_sees_an_uploaded_skill(
    a: httpx.AsyncClient, b: httpx.AsyncClient, env: dict[str, str]
) -> None:
    await upload(a, "3", "Tenant A only.")
    assert "house-style" not in {s["name"] for s in (await b.get("/api/skills")).json()["skills"]}
    missing = await b.get("/api/skills/house-style")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "skill_not_found"
    assert (await b.get("/api/skills/house-style/usage")).status_code == 404
    async with workers(env, 1):
        run_id = await post(b, "other_tenant")
        events = await read_sse(b, f"/api/runs/{run_id}/events")
    (failed,) = data(events, "tool.failed")
    assert "there is no skill 'house-style'" in failed["error"]
    assert data(events, "skill.loaded") == []


async def test_upload_enable_and_disable_answer_clear_errors(a: httpx.AsyncClient) -> None:
    bad = await a.post("/api/skills", json={"skillMd": "no front matter"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_skill"
    assert "front matter" in bad.json()["error"]["message"]
    pinned = await a.post("/api/skills/house-style/enable", json={"version": 9})
    assert pinned.status_code == 422 and pinned.json()["error"]["code"] == "unknown_reference"
    assert "its versions" in pinned.json()["error"]["message"]
    gone = await a.post("/api/skills/no-such-skill/enable", json={"version": 1})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "skill_not_found"
    off = await a.post("/api/skills/research-brief/disable")
    assert off.status_code == 200 and off.json()["enabled"] is False
    on = await a.post("/api/skills/research-brief/enable", json={"version": 1})
    assert on.json()["enabled"] is True and on.json()["pinnedVersion"] == 1
    same = await a.post(
        "/api/skills",
        json={
            "skillMd": HOUSE_STYLE.format(label="3", body="Tenant A only."),
            "resources": {"tone.md": "Plain words."},
        },
    )
    assert same.status_code == 200 and same.headers["Skill-Version-Created"] == "false"


def fold_prefix(events: list[SseEvent], upto: int) -> dict[str, Any]:
    snap = empty_snapshot(events[0].data["runId"])
    for e in events[:upto]:
        apply_event(snap, e.id, e.event, e.data["data"])
    return snap


async def collect_snapshots(
    client: httpx.AsyncClient, run_id: str, into: dict[int, dict[str, Any]]
) -> None:
    """Poll the snapshot until the run ends, keeping one per last event id."""
    while True:
        snap = (await client.get(f"/api/runs/{run_id}/snapshot")).json()
        into.setdefault(snap["lastEventId"], snap)
        if snap["status"] in ("completed", "failed", "cancelled"):
            return
        await asyncio.sleep(0.02)


def assert_snapshots_match_the_log(events: list[SseEvent], seen: dict[int, dict[str, Any]]) -> None:
    for last, snap in seen.items():
        folded = fold_prefix(events, last)
        assert snap.get("plan") == folded.get("plan"), last
        assert snap.get("execution") == folded.get("execution"), last
        assert snap["status"] == folded["status"], last


async def test_a_plan_survives_kill_9_mid_step_and_the_snapshot_follows_the_log(
    a: httpx.AsyncClient, env: dict[str, str]
) -> None:
    seen: dict[int, dict[str, Any]] = {}
    killed = WorkerProcess(env)
    await killed.start()
    try:
        run_id = await post(a, "plan")
        poller = asyncio.create_task(collect_snapshots(a, run_id, seen))
        mid = await wait_until(a, run_id, tool_running("bump_counter"))
        killed.signal(signal.SIGKILL)
        await killed.wait()
    finally:
        await killed.close()
    assert mid["execution"]["step"] == {"id": "1", "title": "Count once"}
    assert mid["execution"]["status"] == "waiting_tool"
    assert mid["execution"]["waitingOn"] == {"kind": "tool", "names": ["bump_counter"]}
    async with workers(env, 1):
        events = await read_sse(a, f"/api/runs/{run_id}/events")
        await asyncio.wait_for(poller, SLOW_S)
    assert events[-1].event == "run.completed", events[-1]
    requeued = next(e.id for e in events if e.event == "run.requeued")
    plans = [(e.id, e.data["data"]["plan"]) for e in events if e.event == "plan.updated"]
    before = [p for seq, p in plans if seq < requeued]
    after = [p for seq, p in plans if seq > requeued]
    # The resumed run goes on from the checkpointed plan: one turn marks two steps.
    assert before[-1]["revision"] == 2 and after[0]["revision"] == 4
    assert [s["title"] for s in after[0]["steps"]] == [s["title"] for s in before[-1]["steps"]]
    assert [s["status"] for s in after[0]["steps"]] == ["done", "running", "pending"]
    final = (await a.get(f"/api/runs/{run_id}/snapshot")).json()
    assert [s["status"] for s in final["plan"]["steps"]] == ["done", "done", "done"]
    assert final["execution"]["step"] is None and final["execution"]["status"] == "completed"
    seen[final["lastEventId"]] = final
    assert len(seen) > 5
    assert_snapshots_match_the_log(events, seen)


async def test_a_cancelled_run_shows_its_remaining_steps_skipped(
    a: httpx.AsyncClient, env: dict[str, str]
) -> None:
    async with workers(env, 1):
        run_id = await post(a, "plan_cancel")
        await wait_until(a, run_id, tool_running("bump_counter"))
        response = await a.post(f"/api/runs/{run_id}/cancel")
        assert response.status_code in (200, 202), response.text
        events = await read_sse(a, f"/api/runs/{run_id}/events")
    assert events[-1].event == "run.cancelled"
    closing = events[-2]
    assert closing.event == "plan.updated" and closing.data["data"]["reason"] == "run.cancelled"
    snap = (await a.get(f"/api/runs/{run_id}/snapshot")).json()
    assert [s["status"] for s in snap["plan"]["steps"]] == ["skipped", "skipped", "skipped"]
    assert snap["execution"]["status"] == "cancelled" and snap["execution"]["step"] is None
    assert_snapshots_match_the_log(events, {snap["lastEventId"]: snap})


async def agentrt(env: dict[str, str], *args: str) -> tuple[int, list[str]]:
    process = await WorkerProcess(env, list(args)).launch()
    try:
        code = await process.wait(limit_s=120)
    finally:
        await process.close()
    return code, process.output


async def test_the_cli_pushes_lists_and_shows_a_skill_folder(
    base_url: str, keys: dict[str, str], env: dict[str, str], tmp_path: Path
) -> None:
    folder = tmp_path / "release-notes"
    (folder / "templates").mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        "---\nname: release-notes\ndescription: Write release notes from a changelog.\n---\n"
        "Group the changes by kind, using `templates/notes.md`.\n"
    )
    (folder / "templates" / "notes.md").write_text("## Added\n## Fixed\n")
    client = ["--url", base_url, "--api-key", keys["b"]]
    code, out = await agentrt(env, "skills", "push", str(folder), *client)
    assert code == 0 and out[-1].startswith("skill release-notes: version 1 (sha256:"), out
    code, out = await agentrt(env, "skills", "push", str(folder), *client)
    assert code == 0 and "unchanged (no new version)" in out[-1], out
    code, out = await agentrt(env, "skills", "list", *client)
    rows = {line.split()[0]: line.split() for line in out[1:] if line.strip()}
    assert code == 0 and rows["release-notes"][1] == "1" and rows["release-notes"][3] == "tenant"
    assert rows["meeting-notes"][3] == "repository"
    code, out = await agentrt(env, "skills", "show", "release-notes@1", *client)
    shown = "\n".join(out)
    assert code == 0 and '"templates/notes.md"' in shown and "Group the changes" in shown
    code, out = await agentrt(env, "skills", "push", str(tmp_path), *client)
    assert code != 0 and "has no SKILL.md" in "\n".join(out)
