"""Tools from MCP servers (stdio and streamable HTTP) through langchain-mcp-adapters.

Discovered tools become `ToolSpec`s that go through the same pipeline as Python tools. Their
risk and permissions come from configuration (default: medium, none; high for a tool the
server marks `destructiveHint`, unless the server's risk is configured); a tool is idempotent
only when the server marks it read-only or idempotent (MCP tool annotations), so an
interrupted call of any other MCP tool stops for a human instead of running twice.

Every call opens its own MCP session (the adapter's default with a `connection`): nothing is
held between calls, and a server restart between two calls costs nothing. Discovery results
are cached per server configuration.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from langchain_mcp_adapters.tools import load_mcp_tools

from tools.config import McpServerConfig, Risk
from tools.errors import describe
from tools.policy import apply_override
from tools.spec import ToolSpec, from_langchain

log = logging.getLogger(__name__)


class McpUnavailableError(RuntimeError):
    """An MCP server could not be reached or listed."""


@dataclass
class _Cached:
    expires: float
    specs: list[ToolSpec] | None
    error: str | None


def _risk(config: McpServerConfig, hints: Mapping[str, object]) -> Risk:
    """Return a tool's risk: the server's configured risk, else high for destructive tools.

    `destructiveHint` is the server's own word that a call may delete or overwrite data, so
    such a call stops for approval unless the operator set the server's risk explicitly.
    """
    if "risk" in config.model_fields_set:
        return config.risk
    if hints.get("destructiveHint") and not hints.get("readOnlyHint"):
        return "high"
    return config.risk


def _specs(server: str, config: McpServerConfig, tools: list[object]) -> list[ToolSpec]:
    specs = []
    prefix = f"{server}_" if config.prefix else ""
    for tool in tools:
        lc = from_langchain(tool)  # type: ignore[arg-type]
        hints = lc.tool.metadata or {}
        base_name = lc.name[len(prefix) :] if prefix and lc.name.startswith(prefix) else lc.name
        spec = lc.replace(
            risk=_risk(config, hints),
            permissions=frozenset(config.permissions),
            timeout_s=config.timeout_s,
            idempotent=bool(hints.get("readOnlyHint") or hints.get("idempotentHint")),
            source=f"mcp:{server}",
        )
        specs.append(apply_override(spec, config.tools.get(base_name)))
    return specs


class McpCatalog:
    """Discover and cache the tools of MCP servers.

    Args:
        ttl_s: How long a successful discovery is reused.
        retry_after_s: How long a failed discovery is remembered before trying again, so a
            server that is down does not slow every run down by its connect timeout.
    """

    def __init__(self, ttl_s: float = 300.0, retry_after_s: float = 30.0) -> None:
        self._ttl_s = ttl_s
        self._retry_after_s = retry_after_s
        self._cache: dict[str, _Cached] = {}
        self._known: dict[str, list[str]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @staticmethod
    def _key(server: str, config: McpServerConfig) -> str:
        return server + "\x00" + json.dumps(config.model_dump(mode="json"), sort_keys=True)

    async def discover(self, server: str, config: McpServerConfig) -> list[ToolSpec]:
        """Return the server's tools as specs.

        Raises:
            McpUnavailableError: the server is down, or listing its tools failed.
        """
        key = self._key(server, config)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            cached = self._cache.get(key)
            if cached is None or cached.expires < time.monotonic():
                cached = await self._load(server, config)
                self._cache[key] = cached
        if cached.specs is None:
            raise McpUnavailableError(cached.error or "unreachable")
        return cached.specs

    async def _load(self, server: str, config: McpServerConfig) -> _Cached:
        try:
            async with asyncio.timeout(config.discovery_timeout_s):
                tools = await load_mcp_tools(
                    None,
                    connection=config.connection(),  # type: ignore[arg-type]
                    server_name=server,
                    tool_name_prefix=config.prefix,
                    handle_tool_errors=False,
                )
        except Exception as exc:  # any failure makes the server's tools unavailable
            message = describe(exc)
            if isinstance(exc, TimeoutError):
                message = f"no answer within {config.discovery_timeout_s:g} s"
            log.warning("MCP server %s is unavailable: %s", server, message)
            return _Cached(time.monotonic() + self._retry_after_s, None, message)
        specs = _specs(server, config, list(tools))
        self._known[self._key(server, config)] = [s.name for s in specs]
        return _Cached(time.monotonic() + self._ttl_s, specs, None)

    async def tools_for(
        self, servers: Mapping[str, McpServerConfig]
    ) -> tuple[list[ToolSpec], dict[str, str]]:
        """Discover every server concurrently.

        Returns:
            The specs of the servers that answered, and for those that did not, a map of
            tool-name patterns (their last known tools, or `<server>_*` when prefixed) to a
            message saying why they are unavailable.
        """
        names = list(servers)
        results = await asyncio.gather(
            *(self.discover(n, servers[n]) for n in names), return_exceptions=True
        )
        specs: list[ToolSpec] = []
        unavailable: dict[str, str] = {}
        for name, result in zip(names, results, strict=True):
            config = servers[name]
            if isinstance(result, BaseException):
                if not isinstance(result, McpUnavailableError):
                    raise result
                reason = f"MCP server {name!r} is not reachable ({result})"
                unavailable[f"mcp:{name}"] = reason
                for known in self._known.get(self._key(name, config), []):
                    unavailable[known] = reason
                if config.prefix:
                    unavailable[f"{name}_*"] = reason
            else:
                specs.extend(result)
        return specs, unavailable
