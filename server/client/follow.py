"""The client side of the `agentrt` command: send messages, follow and inspect runs, approvals.

It talks to a server over HTTP only (`--url`, `--api-key`), and imports nothing heavy, so that
client commands start quickly.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from graphs.events import TERMINAL_EVENTS
from server.client.errors import ClientError

# Tool failures that mean the call was never executed (errorType, tools/errors.py).
REFUSALS = {"unknown_tool", "invalid_arguments", "forbidden", "permission_denied", "rejected"}
# How long `follow` keeps trying to reach a server that went away (a restart, a deploy).
RECONNECT_FOR_S = 300.0


@dataclass(frozen=True)
class ClientConfig:
    """Which server a client command talks to, and as whom."""

    url: str = "http://127.0.0.1:8000"
    api_key: str | None = None

    @classmethod
    def load(cls, url: str | None = None, api_key: str | None = None) -> ClientConfig:
        """Take the flags, else `AGENTRT_URL` / `AGENTRT_API_KEY` from the environment or .env.

        Read here rather than through `Settings` so that client commands start without
        importing pydantic (docs/decisions/1060-cli-start-up.md).
        """
        env: dict[str, str | None] = {}
        if os.path.exists(".env"):
            from dotenv import dotenv_values

            env = dict(dotenv_values(".env"))
        env.update(os.environ)
        return cls(
            url=url or env.get("AGENTRT_URL") or cls.url,
            api_key=api_key or env.get("AGENTRT_API_KEY") or None,
        )


def open_client(url: str, api_key: str | None) -> httpx.AsyncClient:
    """Return an HTTP client for the server at `url`, as the holder of `api_key`."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # Loading the CA bundle costs about a second on a busy machine; plain http needs none.
    verify = url.lower().startswith("https:")
    return httpx.AsyncClient(
        base_url=url, headers=headers, timeout=httpx.Timeout(30, read=None), verify=verify
    )


def check(response: httpx.Response) -> dict[str, Any]:
    """Return the JSON body of a successful response, or raise ClientError with its message."""
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text
        raise ClientError(f"{response.status_code}: {message}")
    return dict(response.json())


@dataclass
class Renderer:
    """Print a run's events for a person watching it in the terminal."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    resuming: bool = False  # an approval was decided: the next start is a resume, not a retry
    started: int = 0

    def event(self, event: dict[str, Any]) -> None:
        """Render one event (as stored in the log: `type`, `data`)."""
        kind, data = event["type"], event["data"]
        text = self._text(kind, data, str(event.get("runId", "")))
        if text:
            self.out.write(text)
            self.out.flush()

    def _text(self, kind: str, data: dict[str, Any], run_id: str) -> str:
        args = json.dumps(data.get("args", {}))
        if kind == "message.item.delta":
            return str(data["delta"])
        if kind == "message.item.completed":
            return "\n" if data.get("status") != "superseded" else "\n[superseded]\n"
        if kind == "tool.started":
            if data.get("refused"):
                return f"  xx {data['name']}({args}) was not run\n"
            return f"  -> {data['name']}({args})\n"
        if kind == "tool.completed":
            output = str(data.get("output", ""))[:200]
            return f"  <- {data['name']}: {output} ({data.get('durationMs', 0):.0f} ms)\n"
        if kind == "tool.failed":
            if data.get("errorType") in REFUSALS:
                return f"     refused ({data.get('errorType')}): {data.get('error')}\n"
            return f"  !! {data['name']} failed: {data.get('error')}\n"
        if kind == "approval.required":
            return (
                f"[waiting for approval {data['approvalId']}: {data['name']}({args})"
                f" - {data.get('reason', '')}]\n"
                f"[decide with: agentrt approve {data['approvalId']}  |  "
                f"agentrt reject {data['approvalId']} --reason ...]\n"
            )
        if kind == "approval.resolved":
            self.resuming = True
            return f"[approval {data['approvalId']}: {data['status']} by {data.get('by')}]\n"
        if kind == "model.retry":
            return (
                f"\n[{data.get('model')}: {data.get('errorClass')};"
                f" retry in {data.get('delayS')} s]\n"
            )
        if kind == "model.fallback":
            return (
                f"\n[{data.get('fromModel')}: {data.get('errorClass')}; "
                f"falling back to {data.get('toModel')}]\n"
            )
        if kind == "run.failed":
            return f"[run failed: {data.get('errorType')}: {data.get('message')}]\n"
        if kind == "run.cancelled":
            return "[run cancelled]\n"
        if kind == "run.paused":
            return f"[run paused; resume with: agentrt runs resume {run_id}]\n"
        if kind == "run.resumed":
            return f"[run resumed by {data.get('by')}]\n"
        if kind == "run.requeued":
            return "" if self.resuming else f"[run requeued: {data.get('reason', '')}]\n"
        if kind == "run.started":
            self.started += 1
            if self.resuming:
                self.resuming = False
                return "[resumed after the decision]\n"
            return "" if self.started == 1 else f"[run restarted, attempt {data.get('attempt')}]\n"
        return ""


def describe_event(event: dict[str, Any]) -> str:
    """One readable line for `agentrt runs events`: seq, time, type and the main fields."""
    data = event.get("data", {})
    fields = " ".join(
        f"{k}={json.dumps(v) if not isinstance(v, str) else v}"
        for k, v in data.items()
        if k not in ("delta",) and not isinstance(v, dict | list)
    )
    if event["type"] == "message.item.delta":
        fields = json.dumps(data.get("delta", ""))
    stamp = str(event.get("ts", ""))[:23]
    return f"{event.get('seq', ''):>6}  {stamp:<23}  {event['type']:<24} {fields}"


async def _stream_once(client: httpx.AsyncClient, run_id: str, after: int, on_event: Any) -> int:
    """Read the run's SSE stream after `after`; return the last seq seen."""
    headers = {"Last-Event-ID": str(after)} if after else {}
    async with client.stream("GET", f"/api/runs/{run_id}/events", headers=headers) as response:
        if response.status_code >= 400:
            check(httpx.Response(response.status_code, content=await response.aread()))
        buffer = ""
        async for text in response.aiter_text():
            buffer += text
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                for line in block.split("\n"):
                    if line.startswith("data: "):
                        event = json.loads(line[6:])
                        on_event(event)
                        after = int(event.get("seq", after))
    return after


async def follow(
    client: httpx.AsyncClient,
    run_id: str,
    on_event: Any,
    *,
    after: int = 0,
    reconnect_for_s: float = RECONNECT_FOR_S,
    err: TextIO | None = None,
) -> str:
    """Follow a run's events until its terminal event; return that event's type.

    A stream that breaks (the server restarted, a proxy timed out) is resumed with
    `Last-Event-ID`, so no event is missed or shown twice.
    """
    last_type = ""

    def track(event: dict[str, Any]) -> None:
        nonlocal last_type
        last_type = event["type"]
        on_event(event)

    down_since: float | None = None
    loop = asyncio.get_running_loop()
    while last_type not in TERMINAL_EVENTS:
        try:
            before, after = after, await _stream_once(client, run_id, after, track)
            down_since = None
            if after == before and last_type not in TERMINAL_EVENTS:
                # The stream ended with nothing new (a server shutting down ends its streams).
                status = check(await client.get(f"/api/runs/{run_id}"))["status"]
                if f"run.{status}" in TERMINAL_EVENTS:
                    return f"run.{status}"
                await asyncio.sleep(1.0)
            continue
        except (httpx.TransportError, httpx.RemoteProtocolError) as exc:
            reason = type(exc).__name__
        except ClientError as exc:
            if not str(exc).startswith(("502", "503", "504")):
                raise
            reason = str(exc)
        if down_since is None:
            down_since = loop.time()
            (err or sys.stderr).write(f"\n[connection lost ({reason}); reconnecting...]\n")
        elif loop.time() - down_since > reconnect_for_s:
            raise ClientError(f"the server stayed unreachable for {reconnect_for_s:g} s")
        await asyncio.sleep(1.0)
    return last_type
