"""A small MCP server for the tests, built with the `mcp` SDK.

Run as a script it serves over stdio; `build()` returns it for streamable HTTP in-process.
"""

from __future__ import annotations

from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations


def build(name: str = "testserver") -> FastMCP:
    """Return the server with its tools."""
    server = FastMCP(name, stateless_http=True, json_response=True, log_level="WARNING")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def shout(text: str) -> str:
        """Return the text in capitals."""
        return text.upper()

    @server.tool()
    def fail(reason: str) -> str:
        """Always fail with the given reason."""
        raise ValueError(reason)

    @server.tool(annotations=ToolAnnotations(destructiveHint=True))
    def delete_record(record_id: str) -> str:
        """Delete a record for good."""
        return f"deleted {record_id}"

    return server


if __name__ == "__main__":
    build().run("stdio")
