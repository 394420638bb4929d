"""The request guard reads a declared Content-Length without failing on odd digits."""

from __future__ import annotations

from typing import Any

import pytest

from server.routes.guards import RequestGuard


async def _call(guard: RequestGuard, length: bytes) -> list[dict[str, Any]]:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/conversations",
        "query_string": b"",
        "headers": [(b"content-length", length)],
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await guard(scope, receive, send)
    return sent


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


@pytest.mark.parametrize(("length", "status"), [(b"\xb2", 204), (b"99", 204), (b"101", 413)])
async def test_a_declared_length_is_read_as_ascii_digits(length: bytes, status: int) -> None:
    sent = await _call(RequestGuard(_ok, max_body_bytes=100), length)
    assert sent[0]["status"] == status
