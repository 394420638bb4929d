"""Hostile input over real HTTP: NUL, lone surrogates, oversized bodies, odd JSON.

Text Postgres cannot store is kept with U+FFFD in its place. Every refusal is a 4xx JSON
error that names the problem, and stores nothing; a fault no handler expects still answers
JSON.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi import FastAPI

from nodes.models.scripted import ScriptedTurn
from server.app import create_app
from server.auth import create_api_key
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import read_sse, serve

MAX_BODY = 8192


class DeliberateError(RuntimeError):
    """Raised by the test-only route to stand for a bug no handler expects."""


async def _fail() -> dict[str, Any]:
    raise DeliberateError("secret internals: /srv/agentrt password=hunter2")


@pytest.fixture(scope="module")
def app(settings: Settings) -> FastAPI:
    secured = settings.model_copy(
        update={
            "auth_enabled": True,
            "max_message_chars": 1000,
            "max_body_bytes": MAX_BODY,
            "max_metadata_bytes": 512,
        }
    )
    models = ModelRegistry(secured, {"hi": [ScriptedTurn(text="hello")]})
    app = create_app(secured, models=models)
    app.add_api_route("/test/fail", _fail)
    return app


@pytest.fixture(scope="module")
async def base_url(app: FastAPI) -> AsyncIterator[str]:
    async with serve(app) as url:
        yield url


@pytest.fixture(scope="module")
async def key(pool: Pool, base_url: str) -> str:
    return await create_api_key(pool, "tenant-g", "gina", ["admin"])


@pytest.fixture
async def client(base_url: str, key: str) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as c:
        yield c


async def counts(pool: Pool) -> dict[str, int]:
    async with pool.connection() as conn:
        out = {}
        for table in ("conversations", "messages", "runs", "run_events", "tenant_tool_configs"):
            cur = await conn.execute(f"SELECT count(*) AS n FROM {table}")
            row = await cur.fetchone()
            assert row is not None
            out[table] = row["n"]
        return out


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json", response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) >= {"code", "message"}
    return error


async def a_conversation(client: httpx.AsyncClient) -> str:
    response = await client.post("/api/conversations", json={})
    assert response.status_code == 201, response.text
    return str(response.json()["conversationId"])


NUL, SURROGATE = "\\u0000", "\\ud800"


@pytest.mark.parametrize("bad", [NUL, SURROGATE])
@pytest.mark.parametrize(
    ("path", "template", "stored"),
    [
        ("conv", '{"title": "a%sb"}', ("title", "a\ufffdb")),
        ("conv", '{"metadata": {"k": ["ok", "v%s"]}}', ("metadata", {"k": ["ok", "v\ufffd"]})),
        ("conv", '{"metadata": {"k%s": 1}}', ("metadata", {"k\ufffd": 1})),
        ("message", '{"content": "hi %s there"}', ("content", "hi \ufffd there")),
    ],
)
async def test_nul_and_lone_surrogates_in_bodies_are_stored_as_replacement_characters(
    client: httpx.AsyncClient, bad: str, path: str, template: str, stored: tuple[str, Any]
) -> None:
    conv = await a_conversation(client)
    url = "/api/conversations" if path == "conv" else f"/api/conversations/{conv}/messages"
    response = await client.post(
        url, content=(template % bad).encode(), headers={"content-type": "application/json"}
    )
    assert response.status_code < 300, response.text
    field, value = stored
    if path == "conv":
        read = await client.get(f"/api/conversations/{response.json()['conversationId']}")
        assert read.json()[field] == value
    else:
        run = response.json()
        await read_sse(client, run["streamUrl"])
        messages = (await client.get(f"/api/conversations/{conv}/messages")).json()["messages"]
        assert messages[0][field] == value, messages


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("conv", '{"model": "demo%s"}'),
        ("message", '{"content": "hi", "model": "demo%s"}'),
    ],
)
async def test_a_name_with_a_nul_names_nothing_and_stores_nothing(
    client: httpx.AsyncClient, pool: Pool, path: str, template: str
) -> None:
    conv = await a_conversation(client)
    url = "/api/conversations" if path == "conv" else f"/api/conversations/{conv}/messages"
    before = await counts(pool)
    response = await client.post(
        url,
        content=(template % NUL).encode(),
        headers={"content-type": "application/json"},
    )
    assert 400 <= response.status_code < 500, response.text
    error = error_of(response, response.status_code)
    assert "\ufffd" in error["message"], error
    assert await counts(pool) == before


@pytest.mark.parametrize(
    "path",
    [
        "/api/runs/run_%00",
        "/api/runs/run_%00/snapshot",
        "/api/runs/run_%00/events",
        "/api/conversations/conv_%00",
        "/api/conversations/conv_%00/runs",
        "/api/approvals/apr_%00",
    ],
)
async def test_nul_in_a_path_id_is_a_json_404(client: httpx.AsyncClient, path: str) -> None:
    error = error_of(await client.get(path), 404)
    assert error["code"] == "not_found"
    assert "NUL" in error["message"]


@pytest.mark.parametrize("query", ["userId=%00", "userId=a%00b&groupBy=user"])
async def test_nul_in_a_query_parameter_is_a_json_422(
    client: httpx.AsyncClient, query: str
) -> None:
    error = error_of(await client.get(f"/api/usage?{query}"), 422)
    assert "NUL" in error["message"]


@pytest.mark.parametrize(
    ("query", "first", "last"),
    [
        ("to=0001-01-05", "0001-01-01", "0001-01-05"),
        ("to=0001-01-30", "0001-01-01", "0001-01-30"),
        ("to=0001-01-31", "0001-01-02", "0001-01-31"),
        ("from=9999-12-30&to=9999-12-31", "9999-12-30", "9999-12-31"),
    ],
)
async def test_a_usage_window_at_the_calendars_ends_is_answered(
    client: httpx.AsyncClient, query: str, first: str, last: str
) -> None:
    response = await client.get(f"/api/usage?{query}")
    assert response.status_code == 200, response.text
    report = response.json()
    assert (report["from"], report["to"], report["days"]) == (first, last, [])


@pytest.mark.parametrize("value", [b"\xb2", b"-1", b"1.5", b"seven", b"9" * 30])
async def test_a_last_event_id_that_is_not_a_seq_is_a_json_400(
    client: httpx.AsyncClient, value: bytes
) -> None:
    conv = await a_conversation(client)
    run = await client.post(
        f"/api/conversations/{conv}/messages", json={"content": "hi", "model": "scripted:hi"}
    )
    response = await client.get(run.json()["streamUrl"], headers={"Last-Event-ID": value})
    error = error_of(response, 400)
    assert "Last-Event-ID" in error["message"]
    # Also beside `after`, which takes precedence over a header that is a seq.
    response = await client.get(
        run.json()["streamUrl"], params={"after": 0}, headers={"Last-Event-ID": value}
    )
    assert "Last-Event-ID" in error_of(response, 400)["message"]
    # Let the run end, so later tests here see no events still being written.
    await read_sse(client, run.json()["streamUrl"])


async def test_an_unexpected_error_answers_json_500_without_internals(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/test/fail")
    error = error_of(response, 500)
    assert error["code"] == "internal_error"
    assert error["requestId"] in error["message"]
    assert "hunter2" not in response.text and "DeliberateError" not in response.text


async def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(
    base_url: str, key: str
) -> None:
    # Headers only: a server that waited for the body would never answer.
    url = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(
            b"POST /api/conversations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {key}\r\nContent-Length: 10000000\r\n\r\n".encode()
        )
        await writer.drain()
        async with asyncio.timeout(30):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 413"), head
            length = int(
                next(
                    line.split(b":")[1]
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
            )
            body = await reader.readexactly(length)
    finally:
        writer.close()
    assert b'"too_large"' in body and b"AGENTRT_MAX_BODY_BYTES" in body


async def test_a_streamed_body_over_the_limit_is_413_json_and_stores_nothing(
    client: httpx.AsyncClient, pool: Pool
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"metadata": {"k": "'
        for _ in range(MAX_BODY // 1024 + 2):
            yield b"x" * 1024
        yield b'"}}'

    before = await counts(pool)
    response = await client.post(
        "/api/conversations", content=chunks(), headers={"content-type": "application/json"}
    )
    error = error_of(response, 413)
    assert error["code"] == "too_large"
    assert str(MAX_BODY) in error["message"]
    assert await counts(pool) == before


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        ({"k": "x" * 600}, "the limit is 512"),
        ({"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}}, "levels deep"),
    ],
)
async def test_metadata_is_bounded_in_size_and_depth(
    client: httpx.AsyncClient, pool: Pool, metadata: dict[str, Any], words: str
) -> None:
    before = await counts(pool)
    error = error_of(await client.post("/api/conversations", json={"metadata": metadata}), 422)
    assert words in error["message"]
    assert await counts(pool) == before


@pytest.mark.parametrize(
    ("body", "status", "code", "words"),
    [
        (b'{"content": "\\u200b\\u200b\\u2060\\ufeff"}', 422, "invalid_request", "invisible"),
        (
            b'{"content": "hi", "options": {"timeoutSeconds": NaN}}',
            422,
            "invalid_request",
            "finite number",
        ),
        (b'{"content": "hi", "options": {"maxCost": Infinity}}', 422, "invalid_request", "finite"),
        # Under the body cap, yet deeper than the JSON parser's recursion limit.
        (b"[" * 4000 + b"]" * 4000, 400, "invalid_json", "nests too deeply"),
    ],
)
async def test_odd_messages_get_the_right_code_and_message(
    base_url: str, key: str, pool: Pool, body: bytes, status: int, code: str, words: str
) -> None:
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client:
        conv = await a_conversation(client)
        before = await counts(pool)
        response = await client.post(f"/api/conversations/{conv}/messages", content=body)
    error = error_of(response, status)
    assert error["code"] == code
    assert words in error["message"]
    assert await counts(pool) == before


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("TRACE", "/api/conversations", "GET, POST"),
        ("OPTIONS", "/api/agents/helper", "DELETE, GET, PUT"),
        ("PUT", "/api/runs/run_1/events", "GET"),
        # Also the path of a GET's template (`/threads/{id}/state/{checkpoint_id}`): the
        # route with the fewest parameters is the resource.
        ("OPTIONS", "/threads/t1/state/checkpoint", "POST"),
    ],
)
async def test_a_method_a_path_does_not_serve_is_405_with_every_method_it_does(
    client: httpx.AsyncClient, method: str, path: str, allow: str
) -> None:
    response = await client.request(method, path)
    error = error_of(response, 405)
    assert error["code"] == "method_not_allowed"
    assert response.headers["allow"] == allow


@pytest.mark.parametrize("value", ["0.5", "1700000000", "-3e2"])
async def test_a_time_given_as_a_number_is_refused(client: httpx.AsyncClient, value: str) -> None:
    error = error_of(await client.get(f"/api/console/usage?until={value}"), 422)
    assert "ISO 8601" in error["message"]
    error = error_of(await client.get(f"/api/usage?to={value}"), 422)
    assert "ISO 8601" in error["message"]
    cron = {"assistant_id": "agent", "schedule": "0 0 1 1 *", "end_time": 1700000000}
    error = error_of(await client.post("/runs/crons", json=cron), 422)
    assert "ISO 8601" in error["message"]


@pytest.mark.parametrize("path", ["/api/conversations", "/api/runs", "/api/console/runs"])
async def test_an_empty_cursor_is_the_first_page(client: httpx.AsyncClient, path: str) -> None:
    await a_conversation(client)
    first = await client.get(path)
    assert first.status_code == 200, first.text
    empty = await client.get(f"{path}?cursor=")
    assert empty.status_code == 200, empty.text
    key = "conversations" if path == "/api/conversations" else "runs"
    ids = "conversationId" if key == "conversations" else "runId"
    assert [r[ids] for r in empty.json()[key]] == [r[ids] for r in first.json()[key]]


async def test_a_langgraph_stream_mode_not_served_is_refused_before_the_run(
    client: httpx.AsyncClient, pool: Pool
) -> None:
    before = await counts(pool)
    ask = {"assistant_id": "agent", "input": {}, "stream_mode": ["values", "bogus"]}
    error = error_of(await client.post("/runs", json=ask), 422)
    assert "stream_mode" in error["message"] and "'values'" in error["message"]
    error = error_of(await client.get("/threads/t1/stream?stream_mode=bogus"), 422)
    assert "run_modes" in error["message"]
    assert await counts(pool) == before


async def test_a_path_another_route_names_literally_is_that_resource(
    client: httpx.AsyncClient,
) -> None:
    # `from-url` also fills `{document_id}` of the documents' GET, whose pattern it fails.
    response = await client.get("/api/knowledge-bases/kb_1/documents/from-url")
    error = error_of(response, 405)
    assert response.headers["allow"] == "POST"
    assert "POST" in error["message"]
    # An id of the wrong form where no other route names the path stays a 422.
    error_of(await client.get("/api/knowledge-bases/kb_1/documents/nope"), 422)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/threads/search", {"offset": False}, "offset"),
        ("/assistants/search", {"limit": "5"}, "limit"),
        ("/store/items/search", {"refresh_ttl": 0}, "refresh_ttl"),
        ("/runs", {"assistant_id": "agent", "input": {}, "after_seconds": "0"}, "after_seconds"),
        ("messages", {"content": "hi", "options": {"maxSteps": "5"}}, "maxSteps"),
        ("messages", {"content": "hi", "options": {"timeoutSeconds": True}}, "timeoutSeconds"),
    ],
)
async def test_a_value_of_another_json_type_than_the_schemas_is_refused(
    client: httpx.AsyncClient, pool: Pool, path: str, body: dict[str, Any], field: str
) -> None:
    if path == "messages":
        path = f"/api/conversations/{await a_conversation(client)}/messages"
    before = await counts(pool)
    error = error_of(await client.post(path, json=body), 422)
    assert field in error["message"]
    assert await counts(pool) == before


async def test_a_refused_type_leaves_the_stored_record_as_it_was(
    client: httpx.AsyncClient, pool: Pool
) -> None:
    created = await client.post("/api/memories", json={"text": "Tea, no sugar.", "confidence": 0.5})
    assert created.status_code == 201, created.text
    memory = created.json()
    patched = await client.patch(f"/api/memories/{memory['id']}", json={"confidence": False})
    assert "confidence" in error_of(patched, 422)["message"]
    again = await client.get(f"/api/memories/{memory['id']}")
    assert again.json()["confidence"] == 0.5
    before = await counts(pool)
    config = {"tools": {"calculator": {"dedupes": 0}}}
    error = error_of(await client.put("/api/tools/config", json=config), 422)
    assert "dedupes" in error["message"]
    index = {"namespace": ["notes"], "key": "k", "value": {"a": 1}, "index": 0}
    assert "index" in error_of(await client.put("/store/items", json=index), 422)["message"]
    assert (await client.get("/store/items?namespace=notes&key=k")).status_code == 404
    assert await counts(pool) == before


async def test_an_integer_sent_as_a_whole_float_is_taken(client: httpx.AsyncClient) -> None:
    found = await client.post("/threads/search", json={"limit": 5.0, "offset": 0.0})
    assert found.status_code == 200, found.text
    conv = await a_conversation(client)
    posted = await client.post(
        f"/api/conversations/{conv}/messages",
        json={"content": "hi", "model": "scripted:hi", "options": {"maxSteps": 5.0}},
    )
    assert posted.status_code == 202, posted.text


@pytest.mark.parametrize("value", [b"\xb2", b"9" * 30, b"seven"])
async def test_a_langgraph_last_event_id_that_names_no_seq_is_answered(
    client: httpx.AsyncClient, value: bytes
) -> None:
    thread = (await client.post("/threads", json={})).json()["thread_id"]
    ask = {"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "hi"}]}}
    created = await client.post(f"/threads/{thread}/runs", json=ask)
    assert created.status_code == 200, created.text
    run = created.json()["run_id"]
    assert (await client.get(f"/threads/{thread}/runs/{run}/join")).status_code == 200
    # A run's stream takes an id that names no seq as none: the whole run again.
    stream = f"/threads/{thread}/runs/{run}/stream"
    whole = await client.get(stream)
    again = await client.get(stream, headers={"Last-Event-ID": value})
    assert again.status_code == 200, again.text
    assert again.text.count("\nid: ") == whole.text.count("\nid: ") > 0
    # The thread's stream names the run in its ids, so it refuses one it did not send.
    cursor = run.encode() + b":" + value
    response = await client.get(f"/threads/{thread}/stream", headers={"Last-Event-ID": cursor})
    assert "Last-Event-ID" in error_of(response, 422)["message"]
