"""The OpenAPI schema builds, documents both answers of the routes that can stream, every
error as the JSON it is sent as, and the rules the routes check beyond the types."""

from __future__ import annotations

from pathlib import Path

from server.app import create_app
from server.langgraph_api.parts import API_MODES
from server.runs.idempotency import MAX_KEY_CHARS
from server.settings import Settings


def test_the_schema_documents_a_json_record_or_an_event_stream_for_a_posted_message(
    tmp_path: Path,
) -> None:
    app = create_app(Settings(_env_file=None, data_dir=tmp_path))  # type: ignore[call-arg]
    paths = app.openapi()["paths"]
    post = paths["/api/conversations/{conversation_id}/messages"]["post"]
    assert "application/json" in post["responses"]["202"]["content"]
    assert "text/event-stream" in post["responses"]["200"]["content"]
    assert any(p["name"] == "stream" for p in post["parameters"])
    events = paths["/api/runs/{run_id}/events"]["get"]
    assert list(events["responses"]["200"]["content"]) == ["text/event-stream"]


def test_every_error_is_documented_as_json_as_it_is_sent(tmp_path: Path) -> None:
    app = create_app(Settings(_env_file=None, data_dir=tmp_path))  # type: ignore[call-arg]
    paths = app.openapi()["paths"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if status[0] in "45" and "content" in response:
                    assert list(response["content"]) == ["application/json"], (method, path)
    # A stream's and a file's own answers keep their media types.
    assert "404" in paths["/api/runs/{run_id}/events"]["get"]["responses"]
    content = paths["/api/artifacts/{artifact_id}/content"]["get"]["responses"]["200"]["content"]
    assert list(content) == ["*/*"]


def test_the_schema_says_what_the_langgraph_routes_check(tmp_path: Path) -> None:
    app = create_app(Settings(_env_file=None, data_dir=tmp_path))  # type: ignore[call-arg]
    spec = app.openapi()
    schemas = spec["components"]["schemas"]
    assert schemas["StorePut"]["properties"]["namespace"]["items"]["pattern"] == "^[^.]+$"
    get_item = spec["paths"]["/store/items"]["get"]["parameters"]
    (namespace,) = [p for p in get_item if p["name"] == "namespace"]
    assert namespace["schema"]["pattern"] == r"^[^.]+(\.[^.]+)*$"
    modes = schemas["RunCreate"]["properties"]["stream_mode"]["anyOf"][0]["enum"]
    assert set(modes) == set(API_MODES)
    post = spec["paths"]["/api/conversations/{conversation_id}/messages"]["post"]
    (key,) = [p for p in post["parameters"] if p["name"] == "Idempotency-Key"]
    assert key["schema"]["maxLength"] == MAX_KEY_CHARS
    for path, pattern in [
        ("/threads/{thread_id}/stream", "^(.+:([0-9]+|end))?$"),
        ("/api/runs/{run_id}/events", "^[0-9]*$"),
    ]:
        (last,) = [p for p in spec["paths"][path]["get"]["parameters"] if p["in"] == "header"]
        assert last["name"] == "last-event-id"
        assert last["schema"] == last["schema"] | {"type": "string", "pattern": pattern}


def test_every_bound_is_written_in_json_schema_terms(tmp_path: Path) -> None:
    # A bound given after a validator in a union reaches the document as pydantic's `ge`.
    app = create_app(Settings(_env_file=None, data_dir=tmp_path))  # type: ignore[call-arg]
    raw = {"ge", "le", "gt", "lt"}

    def walk(node: object, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") in ("integer", "number"):
                assert not raw & node.keys(), (where, node)
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}/{i}")

    document = app.openapi()
    walk(document, "")
    runs = document["components"]["schemas"]["RunOptions"]["properties"]
    assert runs["maxSteps"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 200}
