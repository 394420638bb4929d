"""A minimal HTTP/1.1 client on asyncio streams, for benchmark clients that must stay cheap.

httpx costs about a millisecond of CPU per request and parses SSE line by line; on a
two-core machine that client work competes with the server being measured. This client does
only what the benchmarks need: JSON POST/GET, and an SSE stream read as raw frames.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

TERMINAL = (b"event: run.completed\n", b"event: run.failed\n", b"event: run.cancelled\n")


@dataclass(frozen=True)
class Endpoint:
    """Where the server listens."""

    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> Endpoint:
        """Build an endpoint from a base URL."""
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 80)


async def _open(
    ep: Endpoint, method: str, path: str, body: bytes | None, headers: dict[str, str]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int, dict[str, str]]:
    reader, writer = await asyncio.open_connection(ep.host, ep.port)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {ep.host}:{ep.port}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split(" ", 2)[1])
    parsed = {}
    for line in header_lines:
        if ":" in line:
            key, _, value = line.partition(":")
            parsed[key.strip().lower()] = value.strip()
    return reader, writer, status, parsed


async def _body_chunks(
    reader: asyncio.StreamReader, headers: dict[str, str]
) -> AsyncIterator[bytes]:
    if headers.get("transfer-encoding") == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                return
            chunk = await reader.readexactly(size + 2)
            yield chunk[:-2]
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while data := await reader.read(65536):
            yield data


async def request(
    ep: Endpoint, method: str, path: str, payload: Any = None, headers: dict[str, str] | None = None
) -> Any:
    """Send a request and return the decoded JSON answer; raise on a non-2xx status."""
    body = None if payload is None else json.dumps(payload).encode()
    reader, writer, status, head = await _open(ep, method, path, body, headers or {})
    try:
        data = b"".join([c async for c in _body_chunks(reader, head)])
    finally:
        writer.close()
    if status >= 300:
        raise RuntimeError(f"{method} {path}: HTTP {status}: {data[:300]!r}")
    return json.loads(data) if data else None


@dataclass
class StreamTimes:
    """When a stream was opened, its first byte, first event and end came, and how many events."""

    start: float = 0.0
    first_byte: float = 0.0
    first_event: float = 0.0
    end: float = 0.0
    events: int = 0
    terminal: str = ""


async def sse(
    ep: Endpoint,
    path: str,
    *,
    last_event_id: int | None = None,
    on_frames: Any = None,
    method: str = "GET",
    payload: Any = None,
) -> StreamTimes:
    """Read an SSE stream to its terminal event; count frames, note times (perf_counter).

    `on_frames(now, frames)` is called with every chunk's complete frames (bytes, split).
    `method` and `payload` (JSON) open streams that a POST answers (`?stream=true`).
    """
    headers = {"Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    times = StreamTimes(start=time.perf_counter())
    body = None if payload is None else json.dumps(payload).encode()
    reader, writer, status, head = await _open(ep, method, path, body, headers)
    try:
        if status != 200:
            said = await asyncio.wait_for(reader.read(2000), 10)
            raise RuntimeError(f"{method} {path}: HTTP {status}: {said.decode(errors='replace')}")
        pending = b""
        async for chunk in _body_chunks(reader, head):
            now = time.perf_counter()
            if not times.first_byte:
                times.first_byte = now
            pending += chunk
            cut = pending.rfind(b"\n\n")
            if cut < 0:
                continue
            complete, pending = pending[: cut + 2], pending[cut + 2 :]
            n = complete.count(b"\nid: ") + complete.startswith(b"id: ")
            if n and not times.first_event:
                times.first_event = now
            times.events += n
            if on_frames is not None and n:
                on_frames(now, complete)
            for marker in TERMINAL:  # the terminal frame can be long: it carries the output
                if marker in complete:
                    times.terminal = marker.decode()[7:-1]
                    times.end = now
                    return times
        times.end = time.perf_counter()
        return times
    finally:
        writer.close()
