"""Built-in tools: current time, a safe calculator, and an allow-listed URL fetcher."""

from __future__ import annotations

import ast
import importlib
import math
import operator
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlparse
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx
from langchain_core.tools import BaseTool, ToolException, tool

from tools.spec import ToolSpec


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


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "log": math.log,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}
_MAX_EXPONENT = 1000


def evaluate(expression: str) -> int | float:
    """Evaluate arithmetic without `eval`: numbers, + - * / // % **, a few functions."""

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.Name) and node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
                raise ValueError(f"exponent {right} is too large (limit {_MAX_EXPONENT})")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCTIONS
            and not node.keywords
        ):
            return _FUNCTIONS[node.func.id](*(walk(arg) for arg in node.args))
        raise ValueError(f"unsupported element {ast.dump(node)[:60]!r}")

    try:
        tree = ast.parse(expression.replace("^", "**"), mode="eval")
        return walk(tree)  # type: ignore[no-any-return]
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError) as exc:
        raise ToolException(f"cannot evaluate {expression!r}: {exc}") from exc


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Supports + - * / // % ** (or ^), parentheses, pi, e and sqrt, abs, round, min, max, log.

    Args:
        expression: The expression, for example "12 * (3 + 4) / 2".
    """
    result = evaluate(expression)
    if isinstance(result, float) and result.is_integer():
        result = int(result)
    return str(result)


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


def builtin_tools(fetch_allowlist: Sequence[str]) -> list[BaseTool]:
    """Return the built-in tools; `fetch_url` only reaches `fetch_allowlist`."""
    tools: list[BaseTool] = [current_time, calculator, make_fetch_url(fetch_allowlist)]
    for t in tools:
        t.handle_tool_error = False
    return tools
