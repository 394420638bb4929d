"""Every run is explainable from its trace; /metrics moves by the right amounts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from langchain_core.tools import ToolException, tool
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from nodes.models.scripted import ScriptedToolCall, ScriptedTurn
from server.app import create_app, default_tools
from server.db.pool import Pool
from server.observability.traces import render_tree
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import read_sse, serve, wait_for_status
from tools.errors import RetryableToolError
from tools.spec import RetryPolicy, agent_tool

calls: list[str] = []


@tool
def flaky_lookup(key: str, api_key: str = "") -> str:
    """Look a key up; fails every other time it is asked for a key.

    Args:
        key: What to look up.
        api_key: A credential (redacted in traces).
    """
    calls.append(key)
    if calls.count(key) % 2 == 1:
        raise ToolException(f"lookup service busy for {key}")
    return f"{key}=42"


USAGE = {"input_tokens": 100, "output_tokens": 7, "total_tokens": 107}
SCRIPTS = {
    "traced": [
        ScriptedTurn(
            text="Looking up.",
            usage=USAGE,
            tool_calls=[
                ScriptedToolCall(name="flaky_lookup", args={"key": "k1", "api_key": "sk-secret"})
            ],
        ),
        ScriptedTurn(
            text="Trying again.",
            usage=USAGE,
            tool_calls=[
                ScriptedToolCall(name="flaky_lookup", args={"key": "k1", "api_key": "sk-secret"})
            ],
        ),
        ScriptedTurn(text="k1 is 42.", usage=USAGE),
    ],
    "broken": [ScriptedTurn(text="Thinking", error="provider exploded", fail_after_chunks=1)],
    "full": [
        ScriptedTurn(
            tool_calls=[
                ScriptedToolCall(name="flaky_service", args={"job": "j1"}),
                ScriptedToolCall(name="wire_money", args={"amount": 7}),
            ]
        ),
        ScriptedTurn(text="All done."),
    ],
    "approve": [
        ScriptedTurn(tool_calls=[ScriptedToolCall(name="wire_money", args={"amount": 5})]),
        ScriptedTurn(text="Sent."),
    ],
}


service_calls: list[str] = []


@agent_tool(retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01))
async def flaky_service(job: str) -> str:
    """Run a job on a service that drops every other request.

    Args:
        job: The job to run.
    """
    service_calls.append(job)
    if len(service_calls) % 2 == 1:
        raise RetryableToolError(f"service dropped the request for {job}")
    return f"{job} done"


@agent_tool(risk="high", idempotent=True)
async def wire_money(amount: int) -> str:
    """Send money to the usual account.

    Args:
        amount: How much, in euros.
    """
    return f"sent {amount}"


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
async def client(
    settings: Settings, exporter: InMemorySpanExporter
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        settings,
        models=ModelRegistry(settings, SCRIPTS),
        tools=[*default_tools(settings), flaky_lookup, flaky_service, wire_money],
        span_exporters=[exporter],
    )
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        yield c


async def run_model(client: httpx.AsyncClient, model: str, content: str = "go") -> dict[str, Any]:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    run = (
        await client.post(
            f"/api/conversations/{conv}/messages",
            json={"content": content, "model": f"scripted:{model}"},
        )
    ).json()
    events = await read_sse(client, run["streamUrl"])
    return {**run, "events": events}


def find(span: dict[str, Any], name: str) -> list[dict[str, Any]]:
    found = [span] if span["name"] == name else []
    for child in span["children"]:
        found += find(child, name)
    return found


def metric_samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def test_trace_has_the_expected_span_tree(
    client: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    run = await run_model(client, "traced")
    assert run["events"][-1].event == "run.completed"
    trace_id = run["events"][1].data["data"]["traceId"]
    trace = (await client.get(f"/api/runs/{run['runId']}/trace")).json()

    assert trace["traceId"] == trace_id and trace["failedSpan"] is None
    root = trace["root"]
    assert root["name"] == "run" and root["attributes"]["agentrt.status"] == "completed"
    (attempt,) = root["children"]
    assert attempt["name"] == "run.attempt" and attempt["attributes"]["agentrt.attempt"] == 1
    nodes = [c["name"] for c in attempt["children"]]
    assert nodes == [
        "node build_context",
        "node call_model",
        "node dispatch_tools",
        "node build_context",
        "node call_model",
        "node dispatch_tools",
        "node build_context",
        "node call_model",
    ]
    models = find(root, "model.call")
    assert len(models) == 3
    for span in models:
        assert span["attributes"]["gen_ai.usage.input_tokens"] == 100
        assert span["attributes"]["gen_ai.request.model"]
        assert "agentrt.ttft_ms" in span["attributes"]
        assert span["attributes"]["agentrt.run_id"] == run["runId"]
    tools = find(root, "tool flaky_lookup")
    assert [t["status"] for t in tools] == ["error", "unset"]
    assert "busy" in tools[0]["error"]
    assert all(
        t["parentSpanId"] in {n["spanId"] for n in find(root, "node dispatch_tools")} for t in tools
    )
    leaks = [
        (s["name"], k, str(v)[:300])
        for s in _all(root)
        for k, v in s["attributes"].items()
        if "sk-secret" in str(v)
    ]
    assert leaks == []
    assert "sk-secret" not in str(trace)
    assert "[redacted]" in tools[0]["attributes"]["agentrt.input"]

    # The exact messages sent to the model are retrievable in full.
    first = models[0]
    payload = (
        await client.get(f"/api/runs/{run['runId']}/trace/spans/{first['spanId']}/input")
    ).json()
    assert payload["data"][0][-1]["data"]["content"] == "go"

    # The same spans went to the OpenTelemetry exporter, with the same parent links.
    exported = {
        f"{s.context.span_id:016x}": s
        for s in exporter.get_finished_spans()
        if f"{s.context.trace_id:032x}" == trace_id
    }
    assert len(exported) == trace["spanCount"]
    for span in models + tools:
        assert exported[span["spanId"]].name == span["name"]
        assert f"{exported[span['spanId']].parent.span_id:016x}" == span["parentSpanId"]
    assert "model.call" in render_tree(trace)


async def test_a_payload_cut_in_its_span_is_returned_whole(client: httpx.AsyncClient) -> None:
    long = "lorem ipsum " * 500  # over the 4,000 characters a span attribute keeps
    run = await run_model(client, "broken", content=long)
    trace = (await client.get(f"/api/runs/{run['runId']}/trace")).json()
    model = find(trace["root"], "model.call")[0]
    assert model["attributes"]["agentrt.input_truncated"] is True
    assert len(model["attributes"]["agentrt.input"]) < len(long)
    url = f"/api/runs/{run['runId']}/trace/spans/{model['spanId']}"
    full = (await client.get(f"{url}/input")).json()
    assert full["data"][0][-1]["data"]["content"] == long
    # An output never stored (the call failed) is a 404, not an empty payload.
    assert (await client.get(f"{url}/output")).status_code == 404


async def test_a_failed_runs_trace_names_the_failing_span(client: httpx.AsyncClient) -> None:
    run = await run_model(client, "broken")
    assert run["events"][-1].event == "run.failed"
    trace = (await client.get(f"/api/runs/{run['runId']}/trace")).json()
    assert trace["failedSpan"]["name"] == "model.call"
    assert "provider exploded" in trace["failedSpan"]["error"]
    assert trace["root"]["status"] == "error"
    assert "!! model.call" in render_tree(trace)


async def test_metrics_parse_and_move_by_the_right_amounts(client: httpx.AsyncClient) -> None:
    before = metric_samples((await client.get("/metrics")).text)
    run = await run_model(client, "traced")
    after = metric_samples((await client.get("/metrics")).text)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    model = next(k for k in after if k[0] == "agentrt_tokens_total")[1]
    labels = {k: v for k, v in model if k in ("provider", "model")}
    assert delta("agentrt_tokens_total", **labels, kind="input") == 300
    assert delta("agentrt_tokens_total", **labels, kind="output") == 21
    assert delta("agentrt_model_call_seconds_count", **labels, outcome="ok") == 3
    assert delta("agentrt_tool_call_seconds_count", tool="flaky_lookup", outcome="error") == 1
    assert delta("agentrt_tool_call_seconds_count", tool="flaky_lookup", outcome="ok") == 1
    assert delta("agentrt_tool_errors_total", tool="flaky_lookup") == 1
    assert delta("agentrt_runs_finished_total", status="completed", tenant="default") == 1
    assert delta("agentrt_events_written_total") == len(run["events"])
    assert value(after, "agentrt_sse_connections") == 0
    assert value(after, "agentrt_runs", status="completed", tenant="default") >= 1
    assert value(after, "agentrt_queue_depth") == 0
    assert value(after, "agentrt_workers") == 1


def _all(span: dict[str, Any]) -> list[dict[str, Any]]:
    return [span, *(s for c in span["children"] for s in _all(c))]


async def test_an_approval_wait_is_a_span_and_a_metric(client: httpx.AsyncClient) -> None:
    before = metric_samples((await client.get("/metrics")).text)
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    run = (
        await client.post(
            f"/api/conversations/{conv}/messages",
            json={"content": "pay", "model": "scripted:approve"},
        )
    ).json()
    await wait_for_status(client, run["runId"], "waiting_user")
    (approval,) = (await client.get(f"/api/runs/{run['runId']}/approvals")).json()["approvals"]
    decided = await client.post(
        f"/api/approvals/{approval['approvalId']}", json={"decision": "approve"}
    )
    assert decided.status_code == 200, decided.text
    events = await read_sse(client, run["streamUrl"])
    assert events[-1].event == "run.completed"
    after = metric_samples((await client.get("/metrics")).text)
    trace = (await client.get(f"/api/runs/{run['runId']}/trace")).json()

    (wait,) = find(trace["root"], "approval.wait")
    assert wait["parentSpanId"] == trace["root"]["spanId"]
    assert wait["attributes"]["agentrt.approval.status"] == "approved"
    assert len(trace["root"]["children"]) == 3  # attempt, approval.wait, attempt
    count = "agentrt_approval_wait_seconds_count"
    assert value(after, count) - value(before, count) == 1


async def test_a_run_with_a_retried_tool_and_an_approval_has_the_expected_tree(
    client: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
    run = (
        await client.post(
            f"/api/conversations/{conv}/messages",
            json={"content": "do it", "model": "scripted:full"},
        )
    ).json()
    await wait_for_status(client, run["runId"], "waiting_user")
    (approval,) = (await client.get(f"/api/runs/{run['runId']}/approvals")).json()["approvals"]
    await client.post(f"/api/approvals/{approval['approvalId']}", json={"decision": "approve"})
    events = await read_sse(client, run["streamUrl"])
    assert events[-1].event == "run.completed"
    trace = (await client.get(f"/api/runs/{run['runId']}/trace")).json()
    root = trace["root"]

    assert [c["name"] for c in root["children"]] == ["run.attempt", "approval.wait", "run.attempt"]
    first, wait, second = root["children"]
    assert [c["name"] for c in first["children"]] == [
        "node build_context",
        "node call_model",
        "node await_approval",
    ]
    assert "interrupted" in [e["name"] for e in first["children"][2]["events"]]
    assert wait["attributes"]["agentrt.tool.name"] == "wire_money"
    assert [c["name"] for c in second["children"]] == [
        "node await_approval",
        "node dispatch_tools",
        "node build_context",
        "node call_model",
    ]
    assert len(find(root, "model.call")) == 2
    service = find(second, "tool flaky_service")
    assert [s["status"] for s in service] == ["error", "unset"]
    assert "dropped the request" in service[0]["error"]
    assert len(find(second, "tool wire_money")) == 1
    assert {s["attributes"]["agentrt.attempt"] for s in find(second, "node dispatch_tools")} == {2}

    exported = {
        f"{s.context.span_id:016x}": s
        for s in exporter.get_finished_spans()
        if f"{s.context.trace_id:032x}" == trace["traceId"]
    }
    for span in _all(root):
        assert exported[span["spanId"]].name == span["name"]
        parent = exported[span["spanId"]].parent
        assert (f"{parent.span_id:016x}" if parent else None) == span["parentSpanId"]


@pytest.mark.parametrize(
    ("model", "final"), [("traced", "run.completed"), ("broken", "run.failed")]
)
async def test_a_runs_spans_are_stored_with_its_final_event(
    client: httpx.AsyncClient, pool: Pool, exporter: InMemorySpanExporter, model: str, final: str
) -> None:
    run = await run_model(client, model)
    assert run["events"][-1].event == final
    # Read straight from the table: the trace endpoint would write what the process holds.
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT span_id FROM trace_spans WHERE run_id = %s", (run["runId"],)
        )
        stored = {r["span_id"] for r in await cur.fetchall()}
    ended = {
        f"{s.context.span_id:016x}"
        for s in exporter.get_finished_spans()
        if s.context is not None and (s.attributes or {}).get("agentrt.run_id") == run["runId"]
    }
    assert {"run", "run.attempt"} <= {
        s.name
        for s in exporter.get_finished_spans()
        if (s.attributes or {}).get("agentrt.run_id") == run["runId"]
    }
    assert stored == ended
