"""A fake OpenAI-compatible chat server on a real socket, with scriptable faults.

It speaks just enough HTTP/1.1 for the `openai` SDK and litellm: `POST /v1/embeddings`
(vectors from the offline lexical embedder, so that similar texts are near), and
`POST /v1/chat/completions`,
streamed as SSE in chunked transfer encoding (so a dropped connection is a protocol error, as
in real life) or answered in one JSON body. Each request takes the next `Reply` scripted for
its model (or for "*"); a default answer is given when the script is empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from nodes.embeddings.lexical import lexical_vector


@dataclass
class FakeToolCall:
    """A tool call the fake model makes."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass
class Reply:
    """One scripted answer or fault.

    Attributes:
        text: Answer text, streamed `chunk_chars` characters per chunk.
        tool_calls: Tool calls, streamed after the text.
        usage: The usage block sent (prompt, completion, cached and reasoning tokens).
        status: HTTP status; >= 400 answers `error` as an OpenAI error body.
        headers: Extra response headers (e.g. Retry-After).
        hang: Read the request, then never answer.
        stall_after_chunks: Stream that many chunks, then stop sending (the socket stays open).
        drop_after_chunks: Stream that many chunks, then close the connection mid-body.
        malformed_after_chunks: Stream that many chunks, then an event that is not JSON.
        reasoning: A reasoning summary streamed as `reasoning_content` first.
        delay_s: Wait this long before answering (a slow model).
    """

    text: str = "Hello from the fake model."
    tool_calls: list[FakeToolCall] = field(default_factory=list)
    usage: dict[str, int] | None = None
    chunk_chars: int = 4
    status: int = 200
    error: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False
    stall_after_chunks: int | None = None
    drop_after_chunks: int | None = None
    malformed_after_chunks: int | None = None
    reasoning: str | None = None
    finish_reason: str | None = None
    delay_s: float = 0.0


def usage_block(
    prompt: int, completion: int, cached: int = 0, reasoning: int = 0
) -> dict[str, int]:
    """Return the usage numbers a `Reply` reports."""
    return {"prompt": prompt, "completion": completion, "cached": cached, "reasoning": reasoning}


def rate_limited(retry_after: str = "0", *, ms: str | None = None) -> Reply:
    """A 429 with `Retry-After` (seconds) or `retry-after-ms`."""
    headers = {"retry-after-ms": ms} if ms is not None else {"retry-after": retry_after}
    return Reply(
        status=429,
        headers=headers,
        error={"message": "Rate limit reached", "type": "rate_limit_exceeded", "code": None},
    )


def server_error(status: int = 500) -> Reply:
    """A 5xx."""
    return Reply(
        status=status, error={"message": "The server had an error", "type": "server_error"}
    )


def context_length_error() -> Reply:
    """A 400 saying the prompt is too long."""
    return Reply(
        status=400,
        error={
            "message": "This model's maximum context length is 8192 tokens.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        },
    )


@dataclass
class Served:
    """What the fake received and answered, for assertions."""

    model: str
    body: dict[str, Any]
    reply: Reply
    usage: dict[str, int] | None = None


class FakeOpenAI:
    """The server; use as `async with FakeOpenAI() as fake:` and point clients at `fake.url`."""

    def __init__(self) -> None:
        self._scripts: dict[str, deque[Reply]] = defaultdict(deque)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self.served: list[Served] = []
        self.port = 0
        # Embedding requests with an input containing this text get no answer while it is set.
        self.hold_embeddings: str | None = None
        self.embedding_dims = 64

    @property
    def url(self) -> str:
        """The base URL, as `openai` clients want it (`.../v1`)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, model: str, *replies: Reply) -> None:
        """Queue replies for requests naming `model` ("*" for any model)."""
        self._scripts[model].extend(replies)

    def reset(self) -> None:
        """Forget scripts and what was served."""
        self._scripts.clear()
        self.served.clear()

    def served_for(self, model: str) -> list[Served]:
        """Return the requests served for `model`, in order."""
        return [s for s in self.served if s.model == model]

    async def __aenter__(self) -> FakeOpenAI:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    def _next(self, model: str) -> Reply:
        for key in (model, "*"):
            if self._scripts[key]:
                return self._scripts[key].popleft()
        return Reply()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the server is stopping a hung reply
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                key, value = line.split(":", 1)
                headers[key.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        if method == "POST" and path.endswith("/embeddings"):
            await self._embeddings(writer, json.loads(body or b"{}"))
            return
        if method != "POST" or not path.endswith("/chat/completions"):
            await self._respond(writer, 404, {"error": {"message": f"no route {path}"}})
            return
        request = json.loads(body or b"{}")
        model = str(request.get("model", ""))
        reply = self._next(model)
        served = Served(model, request, reply)
        self.served.append(served)
        if reply.hang:
            await asyncio.Event().wait()
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.status >= 400:
            await self._respond(writer, reply.status, {"error": reply.error or {}}, reply.headers)
            return
        usage = self._usage(reply)
        if request.get("stream"):
            include = bool((request.get("stream_options") or {}).get("include_usage"))
            served.usage = usage if include else None
            await self._stream(writer, model, reply, usage if include else None)
        else:
            served.usage = usage
            await self._respond(writer, 200, self._completion(model, reply, usage), reply.headers)

    async def _embeddings(self, writer: asyncio.StreamWriter, request: dict[str, Any]) -> None:
        model = str(request.get("model", ""))
        inputs = request.get("input", [])
        texts = [inputs] if isinstance(inputs, str) else [str(t) for t in inputs]
        reply = self._next(model)
        served = Served(model, request, reply)
        self.served.append(served)
        hold = self.hold_embeddings
        if reply.hang or (hold is not None and any(hold in t for t in texts)):
            await asyncio.Event().wait()
        if reply.status >= 400:
            await self._respond(writer, reply.status, {"error": reply.error or {}}, reply.headers)
            return
        dims = int(request.get("dimensions") or self.embedding_dims)
        tokens = sum(len(t.split()) for t in texts)
        served.usage = usage_block(prompt=tokens, completion=0)
        payload = {
            "object": "list",
            "model": model,
            "data": [
                {"object": "embedding", "index": i, "embedding": lexical_vector(t, dims)}
                for i, t in enumerate(texts)
            ],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        await self._respond(writer, 200, payload, reply.headers)

    @staticmethod
    def _usage(reply: Reply) -> dict[str, int]:
        given = reply.usage or usage_block(
            prompt=17, completion=max(1, len(reply.text) // 4 + 3 * len(reply.tool_calls))
        )
        return dict(given)

    @staticmethod
    def _usage_json(usage: dict[str, int]) -> dict[str, Any]:
        return {
            "prompt_tokens": usage["prompt"],
            "completion_tokens": usage["completion"],
            "total_tokens": usage["prompt"] + usage["completion"],
            "prompt_tokens_details": {"cached_tokens": usage["cached"]},
            "completion_tokens_details": {"reasoning_tokens": usage["reasoning"]},
        }

    async def _respond(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        payload: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> None:
        body = json.dumps(payload).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write(
            f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n".encode()
            + body
        )
        await writer.drain()

    def _completion(self, model: str, reply: Reply, usage: dict[str, int]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id or f"call_{next(self._ids)}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.args)},
                }
                for call in reply.tool_calls
            ]
        return {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish(reply)}],
            "usage": self._usage_json(usage),
        }

    @staticmethod
    def _finish(reply: Reply) -> str:
        return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")

    async def _stream(
        self,
        writer: asyncio.StreamWriter,
        model: str,
        reply: Reply,
        usage: dict[str, int] | None,
    ) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        )
        response_id = f"chatcmpl-{next(self._ids)}"

        def event(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
            return {
                "id": response_id,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
                "choices": choices,
                **extra,
            }

        def delta(d: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return event([{"index": 0, "delta": d, "finish_reason": finish}])

        events: list[dict[str, Any]] = [delta({"role": "assistant", "content": ""})]
        if reply.reasoning:
            events.append(delta({"reasoning_content": reply.reasoning}))
        size = max(1, reply.chunk_chars)
        events += [
            delta({"content": reply.text[i : i + size]}) for i in range(0, len(reply.text), size)
        ]
        for index, call in enumerate(reply.tool_calls):
            call_id = call.id or f"call_{next(self._ids)}"
            args = json.dumps(call.args)
            start = {"index": index, "id": call_id, "type": "function"}
            events.append(
                delta({"tool_calls": [{**start, "function": {"name": call.name, "arguments": ""}}]})
            )
            for i in range(0, len(args), 8):
                piece = {"index": index, "function": {"arguments": args[i : i + 8]}}
                events.append(delta({"tool_calls": [piece]}))
        events.append(delta({}, self._finish(reply)))
        if usage is not None:
            events.append(event([], usage=self._usage_json(usage)))

        for sent, payload in enumerate(events):
            streamed = sent - 1  # chunks after the opening role chunk
            if streamed == reply.drop_after_chunks:
                writer.transport.abort()
                return
            if streamed == reply.stall_after_chunks:
                await asyncio.Event().wait()
            if streamed == reply.malformed_after_chunks:
                await self._chunk(writer, 'data: {"id": "broken", "choices": [\n\n')
                await self._chunk(writer, "data: [DONE]\n\n")
                await self._end(writer)
                return
            await self._chunk(writer, f"data: {json.dumps(payload)}\n\n")
        await self._chunk(writer, "data: [DONE]\n\n")
        await self._end(writer)

    @staticmethod
    async def _chunk(writer: asyncio.StreamWriter, text: str) -> None:
        data = text.encode()
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await writer.drain()

    @staticmethod
    async def _end(writer: asyncio.StreamWriter) -> None:
        writer.write(b"0\r\n\r\n")
        await writer.drain()
