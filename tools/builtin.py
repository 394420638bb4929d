"""Built-in tools: current time, a safe calculator (tools.calculator), and a URL fetcher."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from datetime import UTC, datetime
from urllib.parse import urlparse
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx
from langchain_core.tools import BaseTool, ToolException, tool

from tools.calculator import calculator, evaluate
from tools.spec import ToolSpec, from_langchain

__all__ = [
    "builtin_tools",
    "calculator",
    "current_time",
    "evaluate",
    "load_tool_modules",
    "make_fetch_url",
]


@tool
def current_time(timezone: str = "UTC") -> str:
    """Return the current date and time in ISO 8601 format.

    Args:
        timezone: An IANA time zone name such as "Europe/Paris"; UTC when omitted.
    """
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ToolException(f"unknown time zone {timezone!r}; use an IANA name") from exc
    return datetime.now(UTC).astimezone(zone).isoformat(timespec="seconds")


def make_fetch_url(allowlist: Sequence[str], max_chars: int = 4000) -> BaseTool:
    """Build the `fetch_url` tool restricted to hosts in `allowlist` (and their subdomains)."""
    allowed = tuple(host.lower() for host in allowlist)

    @tool
    async def fetch_url(url: str) -> str:
        """Fetch a web page over HTTP(S) and return the start of its text.

        Only hosts on the operator's allow-list can be fetched; others are refused.

        Args:
            url: The absolute http or https URL to fetch.
        """
        parsed = urlparse(url)
        host = (parsed.hostname or "").lower()
        if parsed.scheme not in ("http", "https") or not host:
            raise ToolException(f"{url!r} is not an absolute http(s) URL")
        if not any(host == h or host.endswith("." + h) for h in allowed):
            raise ToolException(f"host {host!r} is not on the allow-list ({', '.join(allowed)})")
        try:
            async with httpx.AsyncClient(timeout=10, follow_redirects=False) as client:
                response = await client.get(url)
        except httpx.HTTPError as exc:
            raise ToolException(f"fetching {url} failed: {exc}") from exc
        text = response.text
        cut = f"\n[cut: {len(text) - max_chars} more characters]" if len(text) > max_chars else ""
        return f"HTTP {response.status_code}\n{text[:max_chars]}{cut}"

    return fetch_url


def load_tool_modules(paths: Sequence[str]) -> list[BaseTool | ToolSpec]:
    """Import extra tools named "package.module:attribute" (a tool or a list of them)."""
    found: list[BaseTool | ToolSpec] = []
    for path in paths:
        module_name, _, attribute = path.partition(":")
        value = getattr(importlib.import_module(module_name), attribute)
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:
            if not isinstance(item, BaseTool | ToolSpec):
                raise TypeError(f"{path} gives {type(item).__name__}, not a tool")
            found.append(item)
    return found


def builtin_tools(fetch_allowlist: Sequence[str]) -> list[BaseTool | ToolSpec]:
    """Return the built-in tools; `fetch_url` only reaches `fetch_allowlist`.

    The calculator runs in this process (in a thread): its bounds keep every intermediate
    result under 4000 digits, so no call can hold the GIL for long.
    """
    tools: list[BaseTool] = [current_time, make_fetch_url(fetch_allowlist)]
    for t in tools:
        t.handle_tool_error = False
    return [tools[0], from_langchain(calculator, timeout_s=10.0), tools[1]]
