"""The OpenAPI schema builds, and documents both answers of the routes that can stream."""

from __future__ import annotations

from pathlib import Path

from server.app import create_app
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
