"""Artifacts end to end, on both storage backends: a tool writes, the API lists and serves.

The model is scripted; the S3 backend is a real S3-compatible server (moto's server mode).
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from langchain_core.messages import ToolMessage

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app
from server.auth import create_api_key
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.artifact_tools import render_chart
from tests.support.live import read_sse, serve
from tests.support.processes import ROOT
from tests.support.s3 import make_bucket, s3_server, s3_settings
from tools.artifacts.tools import write_artifact

pytestmark = pytest.mark.timeout(240)
REPORT_V1 = "# Quarterly report\n\n" + "Revenue grew in every region. " * 200
REPORT_V2 = "# Quarterly report (revised)\n\n" + "Revenue grew, costs fell. " * 300
CHART_BYTES = 300_000
SCRIPTS = {
    "files": [
        ScriptedTurn(
            tool_calls=[
                ScriptedToolCall(
                    id="c_report",
                    name="write_artifact",
                    args={"name": "report.md", "content": REPORT_V1},
                ),
                ScriptedToolCall(id="c_chart", name="render_chart", args={"size": CHART_BYTES}),
            ]
        ),
        ScriptedTurn(
            tool_calls=[
                ScriptedToolCall(
                    id="c_revise",
                    name="write_artifact",
                    args={"name": "report.md", "content": REPORT_V2, "media_type": "text/markdown"},
                )
            ]
        ),
        ScriptedTurn(text="The report is in report.md and the chart in chart.png."),
    ]
}


@pytest.fixture(scope="module", params=["local", "s3"])
async def app(
    request: pytest.FixtureRequest, settings: Settings
) -> AsyncIterator[tuple[FastAPI, str]]:
    secured = settings.model_copy(update={"auth_enabled": True})
    async with s3_server() as endpoint:
        if request.param == "s3":
            await asyncio.to_thread(make_bucket, endpoint, "e2e-artifacts")
            secured = s3_settings(secured, endpoint, "e2e-artifacts")
        models = ModelRegistry(secured, SCRIPTS)
        application = create_app(secured, models=models, tools=[write_artifact, render_chart])
        async with serve(application) as url:
            yield application, url


@pytest.fixture(scope="module")
async def keys(pool: Pool, app: tuple[FastAPI, str]) -> dict[str, str]:
    return {
        "ann": await create_api_key(pool, "acme", "ann", []),
        "gus": await create_api_key(pool, "globex", "gus", ["admin"]),
    }


def client_of(url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


async def run_files(client: httpx.AsyncClient) -> tuple[str, str, list[Any]]:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    run = (
        await client.post(
            f"/api/conversations/{conv}/messages",
            json={"content": "write the report", "model": "scripted:files"},
        )
    ).json()
    events = await read_sse(client, run["streamUrl"])
    assert events[-1].event == "run.completed", events[-1].data
    return conv, run["runId"], events


async def download(client: httpx.AsyncClient, link: str, **headers: str) -> httpx.Response:
    response = await client.get(link, headers=headers)
    assert response.status_code in (200, 206), response.text
    return response


async def test_a_tool_writes_artifacts_that_are_listed_and_served_byte_identical(
    app: tuple[FastAPI, str], keys: dict[str, str]
) -> None:
    async with client_of(app[1], keys["ann"]) as ann:
        conv, run_id, events = await run_files(ann)

        written = [e.data["data"] for e in events if e.event.startswith("artifact.")]
        kinds = [
            (e.event, e.data["data"]["name"], e.data["data"]["version"])
            for e in events
            if e.event.startswith("artifact.")
        ]
        assert sorted(kinds) == [
            ("artifact.created", "chart.png", 1),
            ("artifact.created", "report.md", 1),
            ("artifact.updated", "report.md", 2),
        ]
        assert all(w["link"].startswith("/api/artifacts/art_") for w in written)

        listed = (await ann.get(f"/api/runs/{run_id}/artifacts")).json()["artifacts"]
        by_name = {a["name"]: a for a in listed}
        assert set(by_name) == {"report.md", "chart.png"}
        report, chart = by_name["report.md"], by_name["chart.png"]
        assert (report["version"], report["mediaType"], report["size"]) == (
            2,
            "text/markdown",
            len(REPORT_V2.encode()),
        )
        assert chart["metadata"] == {"kind": "chart"} and chart["size"] == CHART_BYTES

        record = (await ann.get(f"/api/artifacts/{report['id']}")).json()
        assert [v["version"] for v in record["versions"]] == [1, 2]
        first = await download(ann, record["versions"][0]["link"])
        assert first.content == REPORT_V1.encode()
        latest = await download(ann, f"/api/artifacts/{report['id']}/content")
        assert latest.content == REPORT_V2.encode()
        assert latest.headers["content-type"].startswith("text/markdown")
        assert latest.headers["x-artifact-version"] == "2"
        assert "report.md" in latest.headers["content-disposition"]

        png = await download(ann, chart["link"])
        assert png.headers["content-type"] == "image/png"
        assert f"sha256:{hashlib.sha256(png.content).hexdigest()}" == chart["checksum"]
        part = await download(ann, chart["link"], Range="bytes=100-199")
        assert part.status_code == 206 and part.content == png.content[100:200]
        assert part.headers["content-range"] == f"bytes 100-199/{CHART_BYTES}"
        past = await ann.get(chart["link"], headers={"Range": f"bytes={CHART_BYTES}-"})
        assert past.status_code == 416 and past.json()["error"]["code"] == "range_not_satisfiable"

        snapshot = (await ann.get(f"/api/runs/{run_id}/snapshot")).json()
        assert {a["name"]: a["version"] for a in snapshot["artifacts"]} == {
            "report.md": 2,
            "chart.png": 1,
        }

        # The model read links, not the content it wrote.
        state = await app[0].state.graph.aget_state({"configurable": {"thread_id": conv}})
        tool_text = {
            m.tool_call_id: str(m.content)
            for m in state.values["messages"]
            if isinstance(m, ToolMessage)
        }
        assert report["id"] in tool_text["c_report"] and "Revenue grew" not in tool_text["c_report"]
        assert '"link":"/api/artifacts/' in tool_text["c_chart"]

        url = (await ann.get(f"/api/artifacts/{chart['id']}/url")).json()
        if url["direct"]:  # object storage: a signed URL that needs no API key
            async with httpx.AsyncClient(timeout=60) as anyone:
                direct = await anyone.get(url["url"])
            assert direct.status_code == 200 and direct.content == png.content
            assert direct.headers["content-type"] == "image/png"
        else:
            assert url["url"] == f"/api/artifacts/{chart['id']}/content?version=1"

    async with client_of(app[1], keys["gus"]) as gus:
        for path in (
            f"/api/artifacts/{report['id']}",
            f"/api/artifacts/{report['id']}/content",
            f"/api/artifacts/{report['id']}/url",
            f"/api/runs/{run_id}/artifacts",
        ):
            answer = await gus.get(path)
            assert answer.status_code == 404, path
            assert answer.json()["error"]["code"] in ("artifact_not_found", "not_found")


async def test_bad_artifact_requests_get_clear_errors(
    app: tuple[FastAPI, str], keys: dict[str, str]
) -> None:
    async with client_of(app[1], keys["ann"]) as ann:
        missing = await ann.get("/api/artifacts/art_nothing/content")
        assert missing.status_code == 404
        assert "no artifact art_nothing" in missing.json()["error"]["message"]
        bad = await ann.get("/api/artifacts/not-an-id")
        assert bad.status_code == 422
        _, run_id, _ = await run_files(ann)
        report = next(
            a
            for a in (await ann.get(f"/api/runs/{run_id}/artifacts")).json()["artifacts"]
            if a["name"] == "report.md"
        )
        nine = await ann.get(f"/api/artifacts/{report['id']}/content?version=9")
        assert nine.status_code == 404 and "no version 9" in nine.json()["error"]["message"]


async def test_the_cli_lists_and_downloads(
    app: tuple[FastAPI, str], keys: dict[str, str], tmp_path: Any
) -> None:
    async with client_of(app[1], keys["ann"]) as ann:
        _, run_id, _ = await run_files(ann)
    common = ["--url", app[1], "--api-key", keys["ann"]]

    async def cli(*args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "server.cli",
            "artifacts",
            *args,
            *common,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        assert proc.returncode == 0, out.decode()
        return out.decode()

    listing = await cli("list", run_id)
    line = next(row for row in listing.splitlines() if row.endswith("report.md"))
    artifact_id = line.split()[0]
    target = tmp_path / "report-v1.md"
    await cli("get", artifact_id, "--version", "1", "-o", str(target))
    assert target.read_bytes() == REPORT_V1.encode()
    shown = await cli("get", artifact_id)
    assert "v1" in shown and "v2" in shown
